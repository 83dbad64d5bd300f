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


def test_the_sdist_carries_the_license_changelog_and_contributing_guide(tmp_path):
    """setuptools builds the source distribution from a clean copy of what it reads (a stale
    *.egg-info in the clone would list files MANIFEST.in no longer ships): LICENSE, CHANGELOG.md and
    CONTRIBUTING.md are in it, and its metadata names the license file."""
    import shutil
    import subprocess
    import tarfile

    src, dist = tmp_path / "src", tmp_path / "dist"
    for name in ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md", "CONTRIBUTING.md"):
        if (REPO / name).exists():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "interp_gpt", src / "interp_gpt", ignore=shutil.ignore_patterns("__pycache__"))
    build = "import setuptools.build_meta as b, sys; print(b.build_sdist(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(dist)], cwd=src, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    sdist = dist / done.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    assert {"LICENSE", "CHANGELOG.md", "CONTRIBUTING.md", "README.md"} <= names
    assert "License-File: LICENSE" in pkg_info
    assert "MIT License" in (REPO / "LICENSE").read_text() and "2026" in (REPO / "LICENSE").read_text()


def test_the_changelog_starts_with_the_current_version_or_unreleased():
    import re

    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
    headings = re.findall(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert headings[0] in ("Unreleased", version) and version in headings
