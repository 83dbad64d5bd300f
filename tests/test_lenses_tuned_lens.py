"""Parity with tuned-lens 0.2 (skipped where it is not installed): over a random Hugging Face GPT-2 and
our raw-weights copy of it, the same translators give the same logits, the same `unembed_hash`, and
each library loads the other's saved folder.

    /work/venvs/tuned/bin/python -m pytest tests/test_lenses_tuned_lens.py
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.lenses import PROCESSING_KEY, TunedLens

tuned_lens = pytest.importorskip("tuned_lens")
pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def pair(hf_gpt2_factory):  # type: ignore[no-untyped-def]
    """(HF GPT2LMHeadModel, our raw-weights GPT of the same checkpoint, tokens)."""
    hf = hf_gpt2_factory(n_head=4, n_embd=64, seed=1)
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    tokens = torch.randint(0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    return hf, ours, tokens


def _theirs_random(hf):  # type: ignore[no-untyped-def]
    lens = tuned_lens.TunedLens.from_model(hf)
    torch.manual_seed(0)
    with torch.no_grad():
        for t in lens:
            t.weight.normal_(std=0.05)
            t.bias.normal_(std=0.2)
    return lens


def _hidden(hf, tokens):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return hf(tokens, output_hidden_states=True).hidden_states[:-1]  # the input of each layer


def test_the_same_translators_give_the_same_logits_and_hash(pair) -> None:  # type: ignore[no-untyped-def]
    hf, ours_model, tokens = pair
    theirs = _theirs_random(hf)
    ours = TunedLens.from_model(ours_model)
    ours.layer_translators.load_state_dict(theirs.layer_translators.state_dict())
    assert len(theirs) == len(ours) == hf.config.n_layer  # one translator per layer, the last one's too
    assert ours.config["unembed_hash"] == theirs.config.unembed_hash
    mine = ours.forward_all(tokens)
    with torch.no_grad():
        for layer, h in enumerate(_hidden(hf, tokens)):
            torch.testing.assert_close(mine[layer], theirs(h, layer), atol=2e-5, rtol=2e-5)
            torch.testing.assert_close(ours(h, layer), theirs(h, layer), atol=2e-5, rtol=2e-5)
    # a zero lens is tuned-lens' logit lens too
    logit = tuned_lens.nn.LogitLens.from_model(hf)
    zero = TunedLens.from_model(ours_model).forward_all(tokens)
    for layer, h in enumerate(_hidden(hf, tokens)):
        with torch.no_grad():
            torch.testing.assert_close(zero[layer], logit(h, layer), atol=2e-5, rtol=2e-5)


def test_we_load_tuned_lens_folder(pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hf, ours_model, tokens = pair
    theirs = _theirs_random(hf)
    theirs.save(tmp_path / "theirs")
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["config.json", "params.pt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same unembedding: no hash warning
        ours = TunedLens.from_pretrained(tmp_path / "theirs", ours_model)
    for k, v in theirs.layer_translators.state_dict().items():
        assert torch.equal(ours.layer_translators.state_dict()[k], v)
    h = _hidden(hf, tokens)[1]
    with torch.no_grad():
        torch.testing.assert_close(ours(h, 1), theirs(h, 1), atol=2e-5, rtol=2e-5)
    # their lens (no processing recorded: Hugging Face's raw weights) on our centred stream: refused
    processed = GPT.from_pretrained(hf, tokenizer=None)
    with pytest.raises(ValueError, match="trained on a raw residual stream"):
        TunedLens.from_pretrained(tmp_path / "theirs", processed)


def test_tuned_lens_loads_our_folder(pair, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    hf, ours_model, tokens = pair
    ours = TunedLens.from_model(ours_model)
    ours.layer_translators.load_state_dict(_theirs_random(hf).layer_translators.state_dict())
    with torch.no_grad():
        ours[0].weight.mul_(-1.5)
    ours.save(tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config[PROCESSING_KEY] == {"fold_ln": False, "center_writing_weights": False, "center_unembed": False}
    with caplog.at_level(logging.WARNING):
        theirs = tuned_lens.TunedLens.from_model_and_pretrained(hf, str(tmp_path / "ours"), map_location="cpu")
    assert "unembedding matrix hash does not match" not in caplog.text  # our hash is theirs
    assert f"Ignoring config key '{PROCESSING_KEY}'" in caplog.text  # our extra key, ignored
    for k, v in ours.layer_translators.state_dict().items():
        assert torch.equal(theirs.layer_translators.state_dict()[k], v)
    with torch.no_grad():
        for layer, h in enumerate(_hidden(hf, tokens)):
            torch.testing.assert_close(theirs(h, layer), ours(h, layer), atol=2e-5, rtol=2e-5)
