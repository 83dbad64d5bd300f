"""Rebuild the demo notebooks: write each demos/NAME.py (jupytext percent format, the source)
to demos/NAME.ipynb and execute it there, outputs included, offline.

    python scripts/execute_notebooks.py                 # all of demos/[0-9][0-9]_*.py
    python scripts/execute_notebooks.py 02_attention_heads

Every plotly figure is displayed with its interactive JSON and a static PNG beside it
(PLOTLY_RENDERER=plotly_mimetype+png; kaleido draws the PNG in headless Chromium, Debian:
`apt-get install -y chromium`): Jupyter and VS Code show the interactive figure, GitHub, which
runs no JavaScript, shows the picture. The kernel runs with HF_HUB_OFFLINE=1 in a temporary
folder, so files a notebook saves (the attention viewer page) are not left in the repo.
`tests/test_demos.py` checks that the committed outputs are those a fresh run gives.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

DEMOS = Path(__file__).resolve().parents[1] / "demos"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# The kernel's environment, on top of ours.
KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",
    # Every figure as plotly's JSON (interactive where plotly's renderer runs) plus a PNG (everywhere else).
    "PLOTLY_RENDERER": "plotly_mimetype+png",
    # No progress bars from transformers / huggingface_hub: their speeds would differ in every run.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    # tqdm.auto warns that ipywidgets is missing, with the path of the user's install.
    "PYTHONWARNINGS": "ignore:IProgress not found",
}


def notebook_from_source(py: Path) -> nbformat.NotebookNode:
    """The notebook that demos/NAME.py describes, without outputs, with cell ids fixed by position
    (so that rebuilding gives the same file)."""
    nb = jupytext.read(py, fmt="py:percent")
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{py.stem[:2]}-{i:02d}"
    nbformat.validate(nb)
    return nb


def execute(
    nb: nbformat.NotebookNode, workdir: Path, timeout_s: int = 600, env: dict[str, str] | None = None
) -> nbformat.NotebookNode:
    """Run every cell of `nb`, in place, in a fresh python3 kernel started in `workdir` with our
    environment plus KERNEL_ENV plus `env` (raises nbclient's CellExecutionError, with the cell
    and its traceback, on the first error)."""
    client = NotebookClient(
        nb,
        timeout=timeout_s,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        record_timing=False,  # no per-cell timestamps in the committed file: they change every run
    )
    client.execute(env={**os.environ, **KERNEL_ENV, **(env or {})})
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = _merge_streams(cell.outputs)
    return nb


def _merge_streams(outputs: list) -> list:
    """Join consecutive stream outputs of the same name (stdout or stderr) into one: where a
    cell's printing is cut into pieces depends on when the kernel flushed, not on the cell."""
    merged: list = []
    for out in outputs:
        last = merged[-1] if merged else None
        if out.output_type == "stream" and last is not None and last.output_type == "stream" and last.name == out.name:
            last.text += out.text
        else:
            merged.append(out)
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebook stems (default: every demos/[0-9][0-9]_*.py)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)
    sources = [DEMOS / f"{Path(name).stem}.py" for name in args.names] or sorted(DEMOS.glob("[0-9][0-9]_*.py"))
    missing = [str(py) for py in sources if not py.is_file()]
    if missing:
        parser.error(f"names: no notebook source {', '.join(missing)}; expected stems of demos/[0-9][0-9]_*.py")
    if args.timeout <= 0:
        parser.error(f"--timeout: got {args.timeout}, expected a positive number of seconds")

    for py in sources:
        nb = notebook_from_source(py)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="interp_gpt_notebook_") as workdir:
            execute(nb, Path(workdir), args.timeout)
        out = py.with_suffix(".ipynb")
        nbformat.write(nb, out)
        size = out.stat().st_size / 1e6
        seconds = time.perf_counter() - start
        print(f"{out.relative_to(DEMOS.parent)}: {len(nb.cells)} cells, {seconds:.0f} s, {size:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
