"""transformer-lens' config and tokenizer surface: the names its (and SAELens') helpers read
from `model.cfg` and `model.tokenizer`, checked against transformer-lens and Hugging Face."""

from __future__ import annotations

import copy
import io
import json
import warnings
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.tokenizer import gpt2_tokenizer


def _cfg(**kw) -> Config:
    return Config(**{"n_layers": 2, "d_model": 32, "n_heads": 4, "d_vocab": 50, "n_ctx": 16, **kw})


def _hf_tokenizer(vocab_dir: Path):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (vocab_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    hf = transformers.GPT2TokenizerFast(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line])
    hf.pad_token = hf.eos_token  # as transformer-lens sets it for GPT-2
    return hf


def test_n_params_counts_the_hidden_weights() -> None:
    cfg = _cfg(d_mlp=48, d_head=5)
    model = GPT(cfg)
    hidden = [p for name, p in model.named_parameters() if name.split(".")[-1] in {"W_Q", "W_K", "W_V", "W_O"}]
    hidden += [p for name, p in model.named_parameters() if name.split(".")[-1] in {"W_in", "W_out"}]
    assert len(hidden) == 6 * cfg.n_layers
    assert cfg.n_params == sum(p.numel() for p in hidden)


def test_n_params_matches_transformer_lens_3() -> None:
    try:
        from transformer_lens import HookedTransformerConfig
    except ImportError:
        pytest.skip("HookedTransformerConfig is transformer-lens 3's (this venv has 4): checked in the 3.9 venv")
    for kw in [{}, {"d_mlp": 48, "d_head": 5, "n_layers": 3}]:
        ours = _cfg(**kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = HookedTransformerConfig(
                n_layers=ours.n_layers, d_model=ours.d_model, n_heads=ours.n_heads, d_head=ours.d_head,
                d_mlp=ours.d_mlp, d_vocab=ours.d_vocab, n_ctx=ours.n_ctx, act_fn=ours.act_fn, device="cpu",
            )  # fmt: skip
        assert ours.n_params == theirs.n_params
        assert ours.d_vocab_out == theirs.d_vocab_out == ours.d_vocab
        assert ours.eps == theirs.eps
        assert ours.dtype == theirs.dtype and ours.device == theirs.device


def test_constant_names_and_eps_alias() -> None:
    cfg = _cfg(layer_norm_eps=1e-3)
    assert (cfg.original_architecture, cfg.default_padding_side, cfg.tokenizer_prepends_bos) == (
        "GPT2LMHeadModel",
        "right",
        False,
    )
    assert cfg.eps == 1e-3
    cfg.eps = 2e-4
    assert cfg.layer_norm_eps == 2e-4
    # Not fields: the dict round trip is unchanged.
    d = cfg.to_dict()
    assert not {"eps", "n_params", "device", "dtype", "d_vocab_out"} & set(d)
    assert Config.from_dict(d) == cfg


def test_device_and_dtype_follow_the_model() -> None:
    assert (_cfg().device, _cfg().dtype) == ("cpu", torch.float32)  # no model yet
    model = GPT(_cfg())
    assert (model.cfg.device, model.cfg.dtype) == ("cpu", torch.float32)
    model.to(torch.float64)
    assert model.cfg.dtype == torch.float64
    twin = copy.deepcopy(model).half()
    assert twin.cfg.dtype == torch.float16 and model.cfg.dtype == torch.float64
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False).to(torch.bfloat16)
    assert loaded.cfg.dtype == torch.bfloat16 and model.cfg.dtype == torch.float64
    with pytest.raises(AttributeError, match=r"Config.device='cuda'.*model.to"):
        model.cfg.device = "cuda"
    with pytest.raises(AttributeError, match=r"Config.dtype=torch.float16.*model.to"):
        model.cfg.dtype = torch.float16


def test_transformer_lens_attention_mask_helper_runs_on_our_tokenizer(gpt2_vocab_dir: Path) -> None:
    utils = pytest.importorskip("transformer_lens.utilities.tokenize_utils")
    tok, hf = gpt2_tokenizer(gpt2_vocab_dir), _hf_tokenizer(gpt2_vocab_dir)
    for side in ("right", "left"):
        tokens, mask = tok.to_tokens(["Hello world, again", "Hi"], padding_side=side)
        tok.padding_side = hf.padding_side = side
        try:
            ours = utils.get_attention_mask(tok, tokens, prepend_bos=True)
            assert torch.equal(ours, utils.get_attention_mask(hf, tokens, prepend_bos=True))
            assert torch.equal(ours, mask)
        finally:
            tok.padding_side = "right"


def test_transformer_lens_tokenize_and_concatenate_runs_on_our_tokenizer(gpt2_vocab_dir: Path) -> None:
    utils = pytest.importorskip("transformer_lens.utilities.tokenize_utils")
    datasets = pytest.importorskip("datasets")
    texts = ["The quick brown fox jumps over the lazy dog. " * 5, "naïve café 🙂 " * 7, "short"]
    data = datasets.Dataset.from_dict({"text": texts})
    tok, hf = gpt2_tokenizer(gpt2_vocab_dir), _hf_tokenizer(gpt2_vocab_dir)
    ours = utils.tokenize_and_concatenate(data, tok, max_length=12, num_proc=1)["tokens"]
    theirs = utils.tokenize_and_concatenate(data, hf, max_length=12, num_proc=1)["tokens"]
    ours, theirs = (torch.stack([torch.as_tensor(row) for row in rows]) for rows in (ours, theirs))
    assert ours.shape[0] > 2 and ours.shape[1] == 12 and torch.equal(ours, theirs)
