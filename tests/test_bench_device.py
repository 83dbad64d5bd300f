"""bench/device.sh and the bench/device.py it wraps keep working without a GPU (issue 27, item 6).

They run on the CPU with the 2-layer toy shapes and one timed round: these tests check that the
run finishes, writes its JSON with the expected keys and a goal table, and reports every goal
(PASS, MISS, or N/A with a reason), not what the ratios are: a CPU in CI says nothing about them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")  # Hugging Face is the forward's and generation's peer

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _device_module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_device", BENCH / "device.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_device_py_reports_every_goal_and_writes_its_results(tmp_path: Path) -> None:
    device = _device_module()
    rc = device.main(["--device", "cpu", "--quick", "--repeats", "1", "--dtypes", "fp32", "--out", str(tmp_path)])
    assert rc == 0  # no required check failed (parity, patching and edge values, greedy tokens)
    (json_file,) = tmp_path.glob("*_device-quick.json")
    txt = json_file.with_suffix(".txt").read_text()
    summary = json.loads(json_file.read_text())
    assert set(summary) == {"environment", "goals", "checks", "results", "part_seconds", "total_seconds"}
    assert summary["environment"]["device"] == "cpu" and summary["environment"]["device_name"]
    assert set(summary["results"]) == set(device.PARTS)
    assert set(summary["results"]["parity"]) == {"fp32", "bf16", "fp16"}
    assert all(c["ok"] for c in summary["checks"] if c["check"].startswith("parity")), summary["checks"]
    reported = {g["part"] for g in summary["goals"] if g["dtype"] == "fp32"}
    assert reported == set(device.GOALS)  # every goal, once
    for g in summary["goals"]:
        assert g["status"] in {"PASS", "MISS", "N/A"}, g
        if g["status"] == "N/A":
            assert g["reason"], g  # a skipped comparison says why
        else:
            assert g["value"] > 0, g
        assert g["goal"] in txt
    assert "| goal" in txt and "checks, 0 failed" in txt
    for part in ("forward", "cache", "generate", "eap", "edges"):  # the peers that are always here
        assert '"peak_memory_increase": {' in json.dumps(summary["results"][part]["fp32"]), part


def test_device_sh_runs_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE_BUDGET": "120"}
    cmd = ["bash", str(BENCH / "device.sh"), "--device", "cpu", "--parts", "parity,forward"]
    cmd += ["--dtypes", "fp32", "--parity-dtypes", "fp32", "--repeats", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "device cpu, budget 120 s" in proc.stdout
    (json_file,) = tmp_path.glob("*.json")
    goals = json.loads(json_file.read_text())["goals"]
    assert [(g["part"], g["dtype"]) for g in goals] == [("forward", "fp32")]


def test_device_py_stops_starting_parts_past_its_budget(tmp_path: Path) -> None:
    device = _device_module()
    # A budget of 1 s is spent before the first part starts (building the checkpoint takes longer).
    rc = device.main(["--device", "cpu", "--budget", "1", "--parts", "forward", "--dtypes", "fp32",
                      "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    (json_file,) = tmp_path.glob("*.json")
    (goal,) = json.loads(json_file.read_text())["goals"]
    assert goal["status"] == "N/A" and "budget" in goal["reason"]
