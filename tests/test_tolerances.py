"""The suite's float comparisons scale with the values compared: no `rtol=0` beside a fixed, literal `atol`.

An `atol` of 1e-6 on values near 12 is a relative 1e-7, below float32's rounding: such a check passes on one
machine and fails on another thread count (it did: `test_max_feature_nodes_keeps_the_most_influential`, 2
of 1,000 adjacency entries off by 1.9e-6). A comparison gives an `rtol` too, or scales its `atol` by the
values (`atol=1e-4 * scale`). Exact checks (`atol=0, rtol=0`) and float64 ones (atol < 1e-9) are exempt.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_LITERAL = r"(\d(?:\.\d+)?e-\d+|0\.0*[1-9]\d*)"
_NOT_SCALED = r"(?![\d.e\-]|\s*[*/])"
_PATTERNS = (
    re.compile(r"atol=" + _LITERAL + _NOT_SCALED + r"\s*,\s*rtol=0(?![.\d])"),
    re.compile(r"rtol=0(?![.\d])\s*,\s*atol=" + _LITERAL + _NOT_SCALED),
)


def fixed_tolerances(source: str) -> list[str]:
    """The `atol` literals of `source` that stand beside `rtol=0` unscaled (float64's tiny ones aside)."""
    found = []
    for pattern in _PATTERNS:
        for m in pattern.finditer(source):
            if float(m.group(1)) >= 1e-9:
                found.append(m.group(0))
    return found


def test_no_comparison_has_a_fixed_absolute_tolerance_alone() -> None:
    files = [p for p in sorted(TESTS.glob("*.py")) if p.name != Path(__file__).name]  # not this file's examples
    bad = {p.name: hits for p in files if (hits := fixed_tolerances(p.read_text("utf-8")))}
    assert not bad, f"rtol=0 with a fixed atol (give an rtol, or scale atol by the values): {bad}"


def test_the_finder_finds_them() -> None:
    assert fixed_tolerances("assert_close(a, b, rtol=0, atol=1e-6)") == ["rtol=0, atol=1e-6"]
    assert fixed_tolerances("assert_close(a, b, atol=1e-5, rtol=0)") == ["atol=1e-5, rtol=0"]
    assert not fixed_tolerances("assert_close(a, b, rtol=0, atol=1e-4 * scale)")
    assert not fixed_tolerances("assert_close(a, b, atol=0, rtol=0)")
    assert not fixed_tolerances("assert_close(a, b, rtol=0, atol=1e-12)")  # float64
    assert not fixed_tolerances("assert_close(a, b, rtol=1e-6, atol=1e-6)")
