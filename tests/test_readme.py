"""The README's examples that run offline run as written."""

from __future__ import annotations

import re
from pathlib import Path

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
