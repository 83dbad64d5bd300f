"""The SAE shipped for tiny-gpt2's blocks.1.hook_resid_pre: its metrics, recomputed from its weights on the
validation text (the last 10% of each corpus file, see `split_corpus`), meet the targets and equal the
metrics.json shipped beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interp_gpt.loading import from_pretrained
from interp_gpt.sae import SAE
from interp_gpt.sae.training import SHIPPED_SAE_DIR, evaluate_sae, shipped_sae, split_corpus, token_windows

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus"


def test_shipped_sae_is_small_and_in_saelens_format() -> None:
    files = {p.name: p.stat().st_size for p in SHIPPED_SAE_DIR.iterdir()}
    assert {"cfg.json", "sae_weights.safetensors", "metrics.json"} <= set(files)
    assert sum(files.values()) <= 10 * 2**20
    sae = shipped_sae()
    assert sae.cfg.hook_name == "blocks.1.hook_resid_pre" and sae.cfg.d_in == 128
    assert sae.cfg.architecture == "topk" and sae.cfg.k is not None and sae.cfg.k <= 32
    assert isinstance(SAE.from_pretrained(SHIPPED_SAE_DIR), SAE)
    cfg = json.loads((SHIPPED_SAE_DIR / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_pre"  # sae-lens 6's place for it


def test_shipped_sae_metrics_on_the_validation_text_meet_the_targets_and_the_json() -> None:
    model = from_pretrained("tiny-gpt2")
    shipped = json.loads((SHIPPED_SAE_DIR / "metrics.json").read_text())
    _, val = split_corpus(CORPUS, 0.1)
    tokens = token_windows(model, val, 128)
    got = evaluate_sae(model, shipped_sae(), tokens)
    assert got["n_tokens"] == shipped["validation"]["n_tokens"] > 100_000
    assert got["l0"] <= 32
    assert got["explained_variance"] >= 0.8
    assert got["ce_loss_recovered"] >= 0.9
    for key in ("l0", "mse", "explained_variance", "ce_clean", "ce_spliced", "ce_zero_ablation", "ce_loss_recovered"):
        assert got[key] == pytest.approx(shipped["validation"][key], rel=1e-4, abs=1e-5), key


def test_readme_features_example_runs(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import re

    text = (CORPUS.parent.parent / "README.md").read_text(encoding="utf-8")
    body = text.split("\n## Training SAEs and seeing features\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", body, flags=re.S)[0]
    monkeypatch.chdir(CORPUS.parent.parent)
    namespace: dict = {}
    exec(compile(block.replace("/tmp/feature185.html", str(tmp_path / "f.html")), "README.md", "exec"), namespace)
    report = namespace["report"]
    assert report.feature == 185 and report.contexts and report.contexts[0]["max_act"] > 0
    assert (tmp_path / "f.html").is_file()


def test_shipped_sae_loads_by_its_release_name() -> None:
    import torch

    by_name = SAE.from_pretrained("tiny-gpt2-res")
    by_id = SAE.from_pretrained("tiny-gpt2-res", "blocks.1.hook_resid_pre")
    for sae in (by_name, by_id):
        assert torch.equal(sae.W_dec, shipped_sae().W_dec)
