"""The transcoders shipped for tiny-gpt2 (per-layer JumpReLU skip transcoders, and a JumpReLU cross-layer
transcoder): their metrics, recomputed from their weights on the validation text (the last 10% of each
corpus file, see `split_corpus`), meet the targets and equal the metrics.json shipped beside them; both
load through their public names, in their formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interp_gpt.loading import from_pretrained
from interp_gpt.sae import CrossLayerTranscoder, Transcoder, load_clt, load_transcoders
from interp_gpt.sae.training import (
    SHIPPED_CLT_DIR,
    SHIPPED_TRANSCODERS_DIR,
    shipped_clt,
    shipped_transcoders,
    split_corpus,
    token_windows,
)
from interp_gpt.sae.transcoders.evaluation import evaluate_transcoders

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus"
KEYS = ("explained_variance", "mse", "l0", "dead_fraction", "ce_clean", "ce_spliced", "ce_zero_ablation",
        "ce_loss_recovered", "n_tokens")  # fmt: skip
# what the shipped sets must reach on the validation text: (explained variance, CE loss recovered) at most 32
# active features per token and layer, no dead feature
TARGETS = {"transcoders": (0.9, 0.95), "clt": (0.85, 0.9)}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_the_shipped_sets_are_small_and_in_their_formats() -> None:
    assert _size(SHIPPED_TRANSCODERS_DIR) <= 10 * 2**20 and _size(SHIPPED_CLT_DIR) <= 10 * 2**20
    for layer in (0, 1):  # sae-lens' transcoder folders, one per layer
        cfg = json.loads((SHIPPED_TRANSCODERS_DIR / f"layer_{layer}" / "cfg.json").read_text())
        assert cfg["architecture"] == "jumprelu_skip_transcoder"
        assert cfg["metadata"]["hook_name"] == f"blocks.{layer}.ln2.hook_normalized"
        assert cfg["metadata"]["hook_name_out"] == f"blocks.{layer}.hook_mlp_out"
        assert cfg["metadata"]["model_processing"] == {"fold_ln": True, "center_writing_weights": True}
    assert "model_kind: cross_layer_transcoder" in (SHIPPED_CLT_DIR / "config.yaml").read_text()  # circuit-tracer's
    tcs, clt = shipped_transcoders(), shipped_clt()
    assert [tc.layer for tc in tcs] == [0, 1] and all(isinstance(tc, Transcoder) and tc.cfg.skip for tc in tcs)
    assert isinstance(clt, CrossLayerTranscoder) and clt.n_layers == 2
    for a, b in zip(tcs, load_transcoders(SHIPPED_TRANSCODERS_DIR), strict=True):
        assert torch.equal(a.W_dec, b.W_dec)
    assert torch.equal(clt.W_enc, load_clt(SHIPPED_CLT_DIR).W_enc)


@pytest.mark.parametrize("name", ["transcoders", "clt"])
def test_shipped_metrics_on_the_validation_text_meet_the_targets_and_the_json(name: str) -> None:
    model = from_pretrained("tiny-gpt2")
    folder = SHIPPED_TRANSCODERS_DIR if name == "transcoders" else SHIPPED_CLT_DIR
    shipped = json.loads((folder / "metrics.json").read_text())["validation"]
    tokens = token_windows(model, split_corpus(CORPUS, 0.1)[1], 128)
    got = evaluate_transcoders(model, shipped_transcoders(model) if name == "transcoders" else shipped_clt(), tokens)
    assert got["n_tokens"] == shipped["n_tokens"] > 100_000
    ev, ce = TARGETS[name]
    assert got["explained_variance"] >= ev and got["ce_loss_recovered"] >= ce
    assert max(got["l0_per_layer"]) <= 32 and got["dead_fraction"] == 0.0
    for key in KEYS:
        assert got[key] == pytest.approx(shipped[key], rel=1e-4, abs=1e-5), key


def test_readme_transcoders_example_runs(tmp_path: Path) -> None:
    import re

    text = (CORPUS.parent.parent / "README.md").read_text(encoding="utf-8")
    body = text.split("\n## Transcoders\n", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", body, flags=re.S)[0]
    namespace: dict = {}
    exec(compile(block.replace("/tmp/tcs-ct", str(tmp_path / "tcs-ct")), "README.md (Transcoders)", "exec"), namespace)
    model, tokens, tcs = namespace["model"], namespace["tokens"], namespace["tcs"]
    assert namespace["feats"].shape == (1, tokens.shape[1], 1024)
    plain = model(tokens)
    assert not torch.allclose(namespace["logits"], plain, atol=1e-3)  # the MLPs were replaced
    assert not torch.allclose(namespace["ablated"], plain, atol=1e-6)  # the intervention moved the output
    assert (tmp_path / "tcs-ct" / "config.yaml").is_file()
    for a, b in zip(tcs, namespace["back"], strict=True):
        assert torch.equal(a.W_enc, b.W_enc)
    assert isinstance(namespace["clt"], CrossLayerTranscoder)
    assert not torch.allclose(namespace["clt_logits"], plain, atol=1e-3)
    assert not torch.allclose(namespace["clt_logits"], namespace["logits"], atol=1e-3)
