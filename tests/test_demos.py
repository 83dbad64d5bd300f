"""The demo notebooks. demos/NAME.py (jupytext percent format) is the source; demos/NAME.ipynb holds
the same cells executed, with outputs and a PNG beside every plotly figure (GitHub's web view runs
no JavaScript). A fresh execution, offline on the shipped model, must give the committed outputs:
the same outputs per cell, and their numbers within a tolerance (not byte equality)."""

from __future__ import annotations

import base64
import copy
import importlib.util
import math
import re
import time
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMOS = ROOT / "demos"
NOTEBOOKS = [
    "01_load_and_compare",
    "02_attention_heads",
    "03_cache_and_patch",
    "04_induction_circuit_from_weights",
    "05_find_the_induction_circuit",
    "06_sae_features",
    "07_attribution_graphs",
    "08_lenses_causal_steering",
    "09_sae_architectures",
]
FIRST_CELL = re.compile(r'^MODEL_NAME = "tiny-gpt2"(\s*#.*)?$')
PLOTLY = "application/vnd.plotly.v1+json"
PNG = "image/png"
MAX_NOTEBOOK_BYTES = 3_000_000
# A fresh number matches a committed one within these, or within one unit of its last printed digit.
REL_TOL, ABS_TOL = 1e-3, 1e-4

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (pip install -e '.[dev]')")
jupytext = pytest.importorskip("jupytext", reason="the notebook tests need jupytext (pip install -e '.[dev]')")


@cache
def _script() -> ModuleType:
    """scripts/execute_notebooks.py, the one command that rebuilds the notebooks."""
    spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "scripts" / "execute_notebooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(name: str) -> Any:
    return nbformat.read(DEMOS / f"{name}.ipynb", as_version=4)


def _code_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code"]


# ----------------------------------------------------------------------------
# Comparing outputs by their numbers
# ----------------------------------------------------------------------------
# A number as Python, torch and plotly print them: -1, 0.632, 2.81e+00, 1e-05, .5
NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# A hook row of a `compare` report (ComparisonReport.table()): name, shape, max |diff|, max rel, ok.
REPORT_ROW = re.compile(r"^(?P<hook>\S+(?: +[\dx]+)?) +(?P<abs>\S+) +(?P<rel>\S+) +(?P<ok>yes|NO)\b", re.M)


def _numbers(text: str) -> list[str]:
    return NUMBER.findall(text)


def _without_reference_details(text: str) -> str:
    """`text` less what, in a `compare` report, belongs to the installed reference rather than to
    us: its name and version (the header line), the hooks only some transformer-lens versions
    expose, and each row's max rel (a rounding error divided by a reference value that may be near
    zero). The suite runs against transformer-lens 3.9 and 4.x; each row keeps its hook, shape,
    max |diff| (rounding noise, well within ABS_TOL) and verdict."""
    if "(tolerance: atol" not in text:
        return text
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith("interp_gpt vs ") and not line.startswith("hooks only we expose")
    ]
    return REPORT_ROW.sub(r"\g<hook> \g<abs> \g<ok>", "\n".join(lines))


def _last_digit(number: str) -> float:
    """One unit in the last printed place of a rounded float ("0.632" -> 0.001, "2.81e+00" -> 0.01):
    a value near a rounding boundary may print either way on another machine. 0 for an integer
    ("14"), which is a count and must match."""
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa and not exponent:
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _close(committed: float, fresh: float, unit: float = 0.0) -> bool:
    if math.isnan(committed) or math.isnan(fresh):
        return math.isnan(committed) and math.isnan(fresh)
    return math.isclose(committed, fresh, rel_tol=REL_TOL, abs_tol=max(ABS_TOL, unit))


def _compare_text(where: str, committed: str, fresh: str) -> list[str]:
    committed, fresh = _without_reference_details(committed), _without_reference_details(fresh)
    old, new = _numbers(committed), _numbers(fresh)
    if len(old) != len(new):
        return [f"{where}: {len(old)} numbers committed, {len(new)} now:\n--- committed\n{committed}\n--- now\n{fresh}"]
    return [
        f"{where}: number {i} is {b} now, {a} committed"
        for i, (a, b) in enumerate(zip(old, new, strict=True))
        if not _close(float(a), float(b), _last_digit(a))
    ]


def _plotly_values(value: Any) -> list[Any]:
    """A plotly trace attribute flattened to a list of numbers and strings; numeric arrays that
    plotly stores as base64 ({"dtype": "f4", "bdata": ...}) are decoded."""
    if isinstance(value, dict) and "bdata" in value:
        import numpy as np

        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"])).tolist()
    if isinstance(value, dict):
        return [v for key in sorted(value) for v in [f"<{key}>", *_plotly_values(value[key])]]
    if isinstance(value, list):
        return [v for item in value for v in _plotly_values(item)]
    return [value]


def _compare_figure(where: str, committed: dict, fresh: dict) -> list[str]:
    """Trace by trace, attribute by attribute: numbers within tolerance, everything else equal."""
    old_traces, new_traces = committed["data"], fresh["data"]
    if len(old_traces) != len(new_traces):
        return [f"{where}: {len(new_traces)} traces now, {len(old_traces)} committed"]
    problems: list[str] = []
    for t, (old, new) in enumerate(zip(old_traces, new_traces, strict=True)):
        if sorted(old) != sorted(new):
            problems.append(f"{where} trace {t}: attributes {sorted(new)} now, {sorted(old)} committed")
            continue
        for key in sorted(old):
            a, b = _plotly_values(old[key]), _plotly_values(new[key])
            if len(a) != len(b):
                problems.append(f"{where} trace {t} {key}: {len(b)} values now, {len(a)} committed")
                continue
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
                if (numbers and not _close(float(x), float(y))) or (not numbers and x != y):
                    problems.append(f"{where} trace {t} {key}[{i}]: {y!r} now, {x!r} committed")
    return problems


def _kinds(cell: Any) -> list[tuple[str, ...]]:
    """Each output's type and stream name or MIME types; the PNG is left out (the tests render none)."""
    return [
        (o.output_type, o.name)
        if o.output_type == "stream"
        else (o.output_type, *sorted(set(o.get("data", {})) - {PNG}))
        for o in cell.outputs
    ]


def output_differences(committed: Any, fresh: Any) -> list[str]:
    """Every way `fresh`'s outputs differ from `committed`'s (same cells): the outputs of each code
    cell (their kinds and order), the numbers in their text, and each plotly figure's data."""
    problems: list[str] = []
    old_cells, new_cells = _code_cells(committed), _code_cells(fresh)
    if [c.source for c in old_cells] != [c.source for c in new_cells]:
        return ["the two notebooks do not have the same code cells"]
    for n, (old, new) in enumerate(zip(old_cells, new_cells, strict=True)):
        where = f"code cell {n}"
        if _kinds(old) != _kinds(new):
            problems.append(f"{where}: outputs {_kinds(new)} now, {_kinds(old)} committed")
            continue
        for k, (a, b) in enumerate(zip(old.outputs, new.outputs, strict=True)):
            at = f"{where} output {k}"
            if a.output_type == "stream":
                problems += _compare_text(f"{at} ({a.name})", a.text, b.text)
            elif a.output_type == "error":
                problems.append(f"{at}: an error output")
            else:
                if "text/plain" in a.data:
                    problems += _compare_text(f"{at} (text/plain)", a.data["text/plain"], b.data["text/plain"])
                if PLOTLY in a.data:
                    problems += _compare_figure(f"{at} (plotly)", a.data[PLOTLY], b.data[PLOTLY])
    return problems


# ----------------------------------------------------------------------------
# The notebooks
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_has_the_cells_of_its_source(name: str) -> None:
    """demos/NAME.ipynb is demos/NAME.py, cell for cell (rebuild with scripts/execute_notebooks.py)."""
    source = jupytext.read(DEMOS / f"{name}.py")
    notebook = _read(name)
    want = [(c.cell_type, c.source) for c in source.cells]
    got = [(c.cell_type, c.source) for c in notebook.cells]
    assert got == want, f"demos/{name}.ipynb is out of date with demos/{name}.py: python scripts/execute_notebooks.py"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_starts_with_model_name(name: str) -> None:
    code = _code_cells(_read(name))
    assert code, f"{name} has no code cells"
    first = code[0].source.strip()
    assert FIRST_CELL.match(first), f'{name}: the first code cell must set MODEL_NAME = "tiny-gpt2", got {first!r}'


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_explains_every_step(name: str) -> None:
    """Markdown opens the notebook and sits between any two code cells; no cell is empty."""
    cells = _read(name).cells
    kinds = [c.cell_type for c in cells]
    assert kinds[0] == "markdown", f"{name} must open with a markdown cell"
    for i in range(1, len(kinds)):
        assert kinds[i - 1 : i + 1] != ["code", "code"], (
            f"{name}: cells {i - 1} and {i} are code with no markdown between"
        )
    for i, cell in enumerate(cells):
        assert cell.source.strip(), f"{name}: cell {i} is empty"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_executed_with_a_picture_of_every_figure(name: str) -> None:
    path = DEMOS / f"{name}.ipynb"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path.name} is {path.stat().st_size} bytes"
    code = _code_cells(_read(name))
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{name}: execution counts {counts}, expected one run top to bottom"
    figures = 0
    for n, cell in enumerate(code):
        for out in cell.outputs:
            assert out.output_type != "error", f"{name}: code cell {n} failed: {out.ename}: {out.evalue}"
            if PLOTLY in out.get("data", {}):
                figures += 1
                assert PNG in out.data, f"{name}: code cell {n} shows a plotly figure with no {PNG} beside it"
                png = base64.b64decode(out.data[PNG])
                assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000, f"{name}: code cell {n}: not a PNG"
    assert figures, f"{name} shows no plotly figure"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_fresh_execution_gives_the_committed_outputs(name: str, tmp_path: Path) -> None:
    """Execute demos/NAME.py in a fresh kernel (offline, in a temporary folder) and compare with
    the committed .ipynb. The figures are not rendered to PNG here (Chromium, ~2 s a figure)."""
    pytest.importorskip("ipykernel", reason="the notebook tests need ipykernel (pip install -e '.[dev]')")
    script = _script()
    fresh = script.notebook_from_source(DEMOS / f"{name}.py")
    start = time.perf_counter()
    script.execute(fresh, tmp_path, timeout_s=300, env={"PLOTLY_RENDERER": "plotly_mimetype"})
    print(f"{name}: {time.perf_counter() - start:.1f} s")
    problems = output_differences(_read(name), fresh)
    assert not problems, f"{name}: the committed outputs are not what a fresh run gives " + "\n".join(problems[:20])
    if name.startswith("02"):
        assert (tmp_path / "attention_viewer.html").is_file(), "notebook 02 must save the attention viewer page"
    if name.startswith("05"):
        assert (tmp_path / "circuit.html").is_file(), "notebook 05 must save the circuit page"


def _decimals(text: str) -> list[re.Match]:
    """The non-zero decimal numbers in `text` (13.495, not 0.000 nor the 0 of blocks.0.attn)."""
    return [m for m in re.finditer(r"-?\b\d+\.\d+\b", text) if float(m.group())]


def _alter_first_number(text: str, factor: float) -> str:
    """`text` with its first non-zero decimal number multiplied by `factor`."""
    match = _decimals(text)[0]
    return text[: match.start()] + repr(float(match.group()) * factor) + text[match.end() :]


def _first(nb: Any, is_wanted: Any) -> tuple[int, int, Any]:
    """(code cell number, output number, output) of the first output of `nb` that `is_wanted`."""
    return next((n, k, o) for n, c in enumerate(_code_cells(nb)) for k, o in enumerate(c.outputs) if is_wanted(o))


def _is_stream_with_decimals(out: Any) -> bool:
    return out.output_type == "stream" and bool(_decimals(out.text))


def _is_figure(out: Any) -> bool:
    return PLOTLY in out.get("data", {})


def test_output_comparison_catches_a_changed_number() -> None:
    committed = _read("03_cache_and_patch")
    assert output_differences(committed, copy.deepcopy(committed)) == []

    # A printed number, 10% off: reported, with the cell.
    changed = copy.deepcopy(committed)
    cell, k, out = _first(changed, _is_stream_with_decimals)
    out.text = _alter_first_number(out.text, 1.1)
    problems = output_differences(committed, changed)
    assert len(problems) == 1 and problems[0].startswith(f"code cell {cell} output {k} (stdout): number"), problems

    # One value of a figure's data (the first array of floats of its first trace): 10% off is
    # reported, with the cell, trace, attribute and index; 1e-6 off is within tolerance.
    cell, k, out = _first(committed, _is_figure)
    trace = out.data[PLOTLY]["data"][0]
    key = next(k for k in ("z", "y", "x") if any(isinstance(v, float) for v in _plotly_values(trace.get(k, []))))
    values = _plotly_values(trace[key])
    i = next(i for i, v in enumerate(values) if isinstance(v, float) and abs(v) > 0.01)
    for factor, reported in ((1.1, True), (1 + 1e-6, False)):
        altered = copy.deepcopy(committed)
        _first(altered, _is_figure)[2].data[PLOTLY]["data"][0][key] = (
            values[:i] + [values[i] * factor] + values[i + 1 :]
        )
        new, old = values[i] * factor, values[i]
        want = [f"code cell {cell} output {k} (plotly) trace 0 {key}[{i}]: {new!r} now, {old!r} committed"]
        assert output_differences(committed, altered) == (want if reported else []), factor

    # A cell whose outputs went missing: the kinds differ.
    fewer = copy.deepcopy(committed)
    _code_cells(fewer)[cell].outputs = []
    assert any(p.startswith(f"code cell {cell}: outputs []") for p in output_differences(committed, fewer))


def _figures_with_captions(name: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(code cell source, the markdown cell before it, plotly JSON) for every figure of NAME."""
    found = []
    last_markdown = ""
    for cell in _read(name).cells:
        if cell.cell_type == "markdown":
            last_markdown = cell.source
            continue
        found += [
            (cell.source, last_markdown, out.data[PLOTLY]) for out in cell.outputs if PLOTLY in out.get("data", {})
        ]
    return found


# The figures each notebook draws: a figure dropped (or an output lost) fails here too.
FIGURES = {
    "01_load_and_compare": 1,
    "02_attention_heads": 7,
    "03_cache_and_patch": 9,
    "04_induction_circuit_from_weights": 6,
    "05_find_the_induction_circuit": 3,
    "06_sae_features": 3,
    "07_attribution_graphs": 2,
    "08_lenses_causal_steering": 6,
    "09_sae_architectures": 2,
}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_figure_follows_a_caption_saying_what_to_look_at(name: str) -> None:
    """The markdown cell just before each figure says "What to look at", with a number from
    tiny-gpt2's run (the values a student should find in the figure)."""
    figures = _figures_with_captions(name)
    assert len(figures) == FIGURES[name], f"{name}: {len(figures)} figures, expected {FIGURES[name]}"
    for source, caption, _ in figures:
        assert "What to look at" in caption, f"{name}: the figure of {source[:60]!r} has no caption"
        said = caption[caption.index("What to look at") :].replace("tiny-gpt2", "")  # a digit of its own
        assert re.search(r"\d", said), f"{name}: the caption before {source[:60]!r} gives no number: {said!r}"


def test_notebook_03_shows_the_estimates_slope() -> None:
    """The scatter of attribution against activation patching gives each sweep's slope beside
    its correlation (a correlation near 1 with the estimates a tenth of the effects would teach
    the wrong lesson)."""
    scatters = 0
    for _, _, figure in _figures_with_captions("03_cache_and_patch"):
        names = [trace.get("name") or "" for trace in figure["data"]]
        if any("r = " in n for n in names):
            scatters += 1
            assert all("slope" in n for n in names if "r = " in n), names
    assert scatters == 1
