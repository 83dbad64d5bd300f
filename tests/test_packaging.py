"""What the wheel ships: the package data patterns cover the shipped model, within 10 MB."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def test_package_data_covers_every_shipped_weights_file_and_stays_under_10_mb():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["interp_gpt"]
    package = REPO / "interp_gpt"
    shipped = sorted(p for p in (package / "weights").rglob("*") if p.is_file())
    assert shipped, "no shipped model under interp_gpt/weights"
    covered = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    assert [p for p in shipped if p not in covered] == []
    assert sum(p.stat().st_size for p in shipped) <= 10 * 2**20
    assert (package / "py.typed") in covered
