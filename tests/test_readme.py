"""The README's examples that run offline run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block_under(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)
    assert len(section) == 2, f"README has no '## {heading}' section"
    body = section[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert blocks, f"README's '{heading}' section has no python block"
    return blocks[0]


def test_cache_and_patch_example_runs_and_means_what_it_says():
    namespace: dict = {}
    exec(compile(_python_block_under("Cache and patch"), "README.md (Cache and patch)", "exec"), namespace)
    model = namespace["model"]
    n_layers, n_heads, n_pos = model.cfg.n_layers, model.cfg.n_heads, namespace["clean"].shape[1]
    assert list(namespace["small"].keys()) == ["blocks.0.attn.hook_pattern"]
    assert namespace["by_pos"].shape == (n_layers, n_pos)
    assert namespace["by_head"].shape == (n_layers, n_heads)
    assert namespace["estimate"]["attn_head_out_all_pos"].shape == (n_layers, n_heads)
    # Entering layer 0, the second halves of clean and corrupted are the same tokens at the
    # same positions: patching them changes nothing, so the metric stays at 0 (corrupted).
    half = namespace["seq"].shape[1]
    assert namespace["by_pos"][0, half:].abs().max() < 1e-5
    assert namespace["by_pos"][0, :half].abs().max() > 1e-3
    assert -1.0 <= namespace["check"].correlation <= 1.0
    # The patching picture (docs/patching.png, this by_pos) and its caption: the two cells the
    # caption names are the two strongest, with the values it gives.
    by_pos = namespace["by_pos"]
    strongest = by_pos.abs().flatten().argsort(descending=True)[:2].tolist()
    assert strongest == [10, by_pos.shape[1] + 11]  # layer 0 at A10, then layer 1 at A11
    text = README.read_text(encoding="utf-8")
    caption = text[text.index("](docs/patching.png)") - 400 : text.index("entering layer 0 it changes nothing")]
    assert f"{by_pos[0, 10]:.2f}" in caption and f"{by_pos[1, 11]:.2f}" in caption


REPO = README.parent
CI_RUN = REPO / ".ci" / "run"


def _bash_lines() -> list[str]:
    text = README.read_text(encoding="utf-8")
    return [line for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S) for line in block.splitlines()]


def test_the_readme_test_command_is_the_line_ci_runs():
    ci = CI_RUN.read_text(encoding="utf-8").splitlines()
    ci_line = ci[next(i for i, line in enumerate(ci) if "Keep this line identical" in line) + 1]
    assert ci_line in _bash_lines()


def test_the_readme_second_venv_command_runs_what_ci_runs_there():
    """The README's one command for the tests that skip under the default install is .ci/run's
    transformer-lens 3.9 + sae-lens venv, step by step (its version assertion aside)."""
    readme = next(line for line in _bash_lines() if line.startswith("python3 -m venv .venv-tl3"))
    ci = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    ci_steps = [line for line in ci if ".venv-tl3" in line and not line.startswith(("#", "rm ", "echo"))]
    ci_steps = [line for line in ci_steps if "importlib.metadata" not in line]
    assert readme.split(" && ") == ci_steps


def test_what_the_readme_examples_write_in_a_clone_is_ignored_by_git():
    """Every relative path the README's commands and examples write (--out, --json, --html, save_html,
    harvest folders) is in .gitignore, so trying them leaves `git status` clean."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git clone")
    text = README.read_text(encoding="utf-8")
    written = set(re.findall(r"--(?:out|json|html) ([\w./-]+)", text))
    written |= set(re.findall(r"""["']([\w./-]+\.(?:html|json))["']""", text))  # pages and JSON from Python
    written |= set(re.findall(r"""harvest\(["']([\w./-]+)["']""", text))
    written = {w.rstrip("/") for w in written if not w.startswith(("/", "DIR", "PAGE", "GRAPH", "interp_gpt/"))}
    assert {"acts", "circuit.html", "graph.html"} <= written
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *sorted(written)], cwd=REPO, capture_output=True, text=True
    )
    ignored = set(done.stdout.split())
    assert sorted(written - ignored) == []


# Every python block of the README, each alone in a fresh namespace ---------------------------

NEEDS = "# needs:"  # a block's first line when it cannot run offline; the line names the substitute
MAX_NEEDS = 3


def _python_blocks() -> list[tuple[str, str]]:
    """(id, code) for every ```python block: id is its section's title and its index there."""
    text = README.read_text(encoding="utf-8")
    out: list[tuple[str, str]] = []
    for section in re.split(r"\n(?=#{2,3} )", text):
        title = section.splitlines()[0].lstrip("# ").strip()
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", section, flags=re.S)):
            out.append((f"{title} [{i}]", code))
    return out


BLOCKS = _python_blocks()


def test_the_readme_has_python_blocks_and_few_need_anything_offline_lacks():
    assert len(BLOCKS) >= 12
    needs = [(name, code.splitlines()[0]) for name, code in BLOCKS if code.startswith(NEEDS)]
    assert len(needs) <= MAX_NEEDS, needs
    for name, line in needs:
        assert "offline substitute:" in line, f"{name}: {line!r} names no offline substitute"


@pytest.mark.parametrize("name,code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_readme_python_block_runs_as_written(name, code, tmp_path, monkeypatch):
    """The block alone, in a fresh namespace, in an empty folder (the clone's data/ linked in, and
    /tmp/ paths moved under it), with plotly's `show` a no-op: no browser, no network."""
    if code.startswith(NEEDS):
        pytest.skip(code.splitlines()[0])
    import plotly.graph_objects as go

    monkeypatch.setattr(go.Figure, "show", lambda self, *a, **k: None)
    (tmp_path / "data").symlink_to(REPO / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    code = code.replace('"/tmp/', f'"{tmp_path}/')
    exec(compile(code, f"README.md ({name})", "exec"), {"__name__": "readme_block"})


DOC_PAGES = sorted(p for p in (REPO / "docs").rglob("*.md") if "```python" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", DOC_PAGES, ids=[str(p.relative_to(REPO)) for p in DOC_PAGES])
def test_a_doc_page_python_blocks_run_in_order(page, tmp_path, monkeypatch):
    """The site's own blocks (beyond the README sections it pulls in), one page read top to bottom:
    its blocks in order, in one namespace, as a reader would run them."""
    import plotly.graph_objects as go

    monkeypatch.setattr(go.Figure, "show", lambda self, *a, **k: None)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "doc_page"}
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)):
        exec(compile(code, f"{page.name} [{i}]", "exec"), namespace)
