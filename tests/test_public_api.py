"""Every public name interp_gpt offered still imports from the same place with the same parameters.

`tests/data/public_api.json` lists them (written by `python tests/api_snapshot.py`). Moving code
between modules must keep every recorded name importable where it was; a name may be added,
never dropped or re-signed without re-recording the file on purpose.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_snapshot import snapshot  # noqa: E402

RECORDED = json.loads((Path(__file__).resolve().parent / "data" / "public_api.json").read_text())
NOW = snapshot()


def _compatible(recorded: object, current: object) -> bool:
    """Equal, or equal but for parameters added after the recorded ones that are keyword-only
    (with a default, unless they spell out a recorded `**kwargs`): every call that worked still
    works the same."""
    if recorded == current or not (isinstance(recorded, list) and isinstance(current, list)):
        return recorded == current
    had_kwargs = bool(recorded) and recorded[-1][1] == "VAR_KEYWORD"
    head = recorded[:-1] if had_kwargs else recorded
    if current[: len(head)] != head:
        return False
    for i, (_, kind, default) in enumerate(current[len(head) :]):
        last = i == len(current) - len(head) - 1
        if not (kind == "KEYWORD_ONLY" and (default or had_kwargs) or (kind == "VAR_KEYWORD" and had_kwargs and last)):
            return False
    return True


@pytest.mark.parametrize("module", sorted(RECORDED))
def test_every_recorded_name_still_exports_with_the_same_signature(module: str) -> None:
    now = NOW.get(module, {})
    missing = [n for n in RECORDED[module] if n not in now]
    assert not missing, f"{module} no longer exports {missing}"
    for name, recorded in RECORDED[module].items():
        current = now[name]
        assert recorded.keys() == current.keys(), f"{module}.{name} changed kind: {recorded.keys()} -> {current.keys()}"
        if "class" in recorded:
            gone = [m for m in recorded["class"] if m not in current["class"]]
            assert not gone, f"{module}.{name} lost {gone}"
            for member, sig in recorded["class"].items():
                assert _compatible(sig, current["class"][member]), (
                    f"{module}.{name}.{member}: {sig} -> {current['class'][member]}"
                )
        else:
            kind = next(iter(recorded))
            assert _compatible(recorded[kind], current[kind]), f"{module}.{name}: {recorded} -> {current}"


def test_spelling_out_kwargs_is_compatible_and_nothing_else_is() -> None:
    kw = [["source", "POSITIONAL_OR_KEYWORD", ""], ["kwargs", "VAR_KEYWORD", ""]]
    assert _compatible(kw, [["source", "POSITIONAL_OR_KEYWORD", ""], ["fold_ln", "KEYWORD_ONLY", "True"]])
    assert not _compatible(kw, [["src", "POSITIONAL_OR_KEYWORD", ""], ["fold_ln", "KEYWORD_ONLY", "True"]])
    assert not _compatible(kw, [["source", "POSITIONAL_OR_KEYWORD", ""], ["fold_ln", "POSITIONAL_OR_KEYWORD", ""]])
    assert not _compatible([["a", "POSITIONAL_OR_KEYWORD", "1"]], [["a", "POSITIONAL_OR_KEYWORD", "2"]])
    fixed = [["a", "POSITIONAL_OR_KEYWORD", ""]]
    assert _compatible(fixed, fixed + [["b", "KEYWORD_ONLY", "False"]])  # a new option with a default
    assert not _compatible(fixed, fixed + [["b", "KEYWORD_ONLY", ""]])  # a new required keyword
    assert not _compatible(fixed, fixed + [["b", "POSITIONAL_OR_KEYWORD", "False"]])


def test_the_snapshot_sees_a_dropped_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import interp_gpt.patching

    monkeypatch.delattr(interp_gpt.patching, "attribution_patch")
    assert "attribution_patch" not in snapshot()["interp_gpt.patching"]


@pytest.mark.parametrize(
    "module",
    [
        "interp_gpt.cli",
        "interp_gpt.activation_store",
        "interp_gpt.sae.training",
        "interp_gpt.sae.train_transcoder_command",
    ],
)
def test_the_documented_python_m_entry_points_still_run(module: str) -> None:
    """`python -m` paths the README and earlier releases gave keep working after the house's move."""
    import subprocess

    args = [sys.executable, "-m", module, *(["harvest"] if module.endswith("activation_store") else []), "--help"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
