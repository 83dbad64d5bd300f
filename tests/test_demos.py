"""The demo notebooks (demos/*.ipynb) run top to bottom, offline, on the shipped model."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

DEMOS = Path(__file__).resolve().parents[1] / "demos"
NOTEBOOKS = ["01_load_and_compare.ipynb", "02_attention_heads.ipynb", "03_cache_and_patch.ipynb"]
CELL_TIMEOUT_S = 300
FIRST_CELL = re.compile(r'^MODEL_NAME = "tiny-gpt2"(\s*#.*)?$')


def _read(name: str) -> Any:
    """The notebook as an nbformat NotebookNode (skips the test without nbformat)."""
    nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (pip install -e '.[dev]')")
    return nbformat.read(DEMOS / name, as_version=4)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs_and_starts_with_model_name(name: str) -> None:
    nb = _read(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code cells"
    first = code[0].source.strip()
    assert FIRST_CELL.match(first), f'{name}: the first code cell must set MODEL_NAME = "tiny-gpt2", got {first!r}'
    for i, cell in enumerate(code):
        assert not cell.get("outputs") and cell.get("execution_count") is None, f"{name}: code cell {i} has outputs"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_explains_every_step(name: str) -> None:
    """Markdown opens the notebook and sits between any two code cells."""
    kinds = [c.cell_type for c in _read(name).cells]
    assert kinds[0] == "markdown", f"{name} must open with a markdown cell"
    for i in range(1, len(kinds)):
        assert kinds[i - 1 : i + 1] != ["code", "code"], (
            f"{name}: cells {i - 1} and {i} are code with no markdown between"
        )
    for i, cell in enumerate(_read(name).cells):
        assert cell.source.strip(), f"{name}: cell {i} is empty"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Execute every cell in a fresh python3 kernel, in a temporary working directory;
    any cell error fails the test with the cell's traceback."""
    pytest.importorskip("ipykernel", reason="the notebook tests need ipykernel (pip install -e '.[dev]')")
    nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient (pip install -e '.[dev]')")
    nb = _read(name)
    # The kernel inherits this environment: never reach the Hugging Face hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the failing cell and traceback, on any error
    print(f"{name}: {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"{name}: {errors[0].ename}: {errors[0].evalue}"
    if name.startswith("02"):
        assert (tmp_path / "attention_viewer.html").is_file(), "notebook 02 must save the attention viewer page"
