"""transformer-lens' config and tokenizer surface: the names its (and SAELens') helpers read
from `model.cfg` and `model.tokenizer`, checked against transformer-lens and Hugging Face."""

from __future__ import annotations

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
    assert not {"eps", "n_params", "d_vocab_out"} & set(d)
    assert Config.from_dict(d) == cfg


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


# -- from_pretrained: transformer-lens' dtype strings and GPT-2 aliases ------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [("float32", torch.float32), ("fp16", torch.float16), ("bfloat16", torch.bfloat16), ("float64", torch.float64)],
)
def test_from_pretrained_takes_dtype_names(name: str, expected: torch.dtype) -> None:
    model = GPT.from_pretrained("tiny-gpt2", dtype=name)
    assert model.W_E.dtype == expected
    assert {p.dtype for p in model.parameters()} == {expected}


def test_dtype_names_cover_transformer_lens_3() -> None:
    from interp_gpt.model.pretrained import _DTYPE_NAMES

    try:
        from transformer_lens.HookedTransformer import DTYPE_FROM_STRING
    except ImportError:
        pytest.skip("DTYPE_FROM_STRING is transformer-lens 3's (this venv has 4): checked in the 3.9 venv")
    assert {k: _DTYPE_NAMES[k] for k in DTYPE_FROM_STRING} == DTYPE_FROM_STRING


@pytest.mark.parametrize("bad", ["float8", "int32", "torch.float32", torch.int64, 16])
def test_from_pretrained_refuses_other_dtypes_naming_dtype(bad: object) -> None:
    with pytest.raises(TypeError, match=r"dtype=.*expected a floating-point torch.dtype.*'bf16'"):
        GPT.from_pretrained("tiny-gpt2", dtype=bad)  # type: ignore[arg-type]


def test_hub_aliases_are_transformer_lens_names() -> None:
    from interp_gpt.checkpoints.sources import hub_id

    assert hub_id("gpt2-small") == hub_id("GPT2-Small") == "gpt2"
    assert {hub_id(n) for n in ("distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs")} == {"distilgpt2"}
    assert [hub_id(n) for n in ("gpt2", "gpt2-medium", "openai-community/gpt2", "someone/gpt2-small")] == [
        "gpt2",
        "gpt2-medium",
        "openai-community/gpt2",
        "someone/gpt2-small",
    ]
    try:
        from transformer_lens.supported_models import MODEL_ALIASES
    except ImportError:
        return  # transformer-lens 4 keeps its alias table elsewhere; checked in the 3.9 venv
    for official in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2"):
        assert all(hub_id(alias) == official for alias in MODEL_ALIASES.get(official, []))


def test_from_pretrained_resolves_an_alias_before_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    from interp_gpt.checkpoints import convert
    from interp_gpt.checkpoints.sources import shipped_models

    asked: list[str] = []

    def fake_download(repo_id: str) -> Path:
        asked.append(repo_id)
        return shipped_models()["tiny-gpt2"]

    monkeypatch.setattr(convert, "download_checkpoint", fake_download)
    model = GPT.from_pretrained("gpt2-small", tokenizer=None)
    assert asked == ["gpt2"] and model.cfg.model_name == "gpt2"


def test_download_resolves_aliases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    from interp_gpt.checkpoints.sources import download_checkpoint

    asked: list[str] = []
    (tmp_path / "model.safetensors").write_bytes(b"")

    def fake_snapshot(repo_id: str, **kw: object) -> str:
        asked.append(repo_id)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    assert download_checkpoint("distil-gpt2") == tmp_path and asked == ["distilgpt2"]


def test_decode_skip_special_tokens_as_hugging_face(gpt2_vocab_dir: Path) -> None:
    tok, hf = gpt2_tokenizer(gpt2_vocab_dir), _hf_tokenizer(gpt2_vocab_dir)
    ids = [50256, 15496, 995, 50256, 0]
    for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert tok.batch_decode([ids, ids[1:]], skip_special_tokens=skip) == hf.batch_decode(
            [ids, ids[1:]], skip_special_tokens=skip
        )
    assert "<|endoftext|>" not in tok.decode(ids, skip_special_tokens=True)


def test_config_seed_fixes_the_initial_weights_and_leaves_global_rngs_alone() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b, c = (GPT(_cfg(seed=s)) for s in (7, 7, 8))
    assert torch.equal(torch.get_rng_state(), state)  # the global generator was not drawn from
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.W_Q, c.W_Q)
    assert Config.from_dict(_cfg(seed=7).to_dict()).seed == 7


@pytest.mark.parametrize(
    ("kw", "match"), [({"attention_dir": "bidirectional"}, "attention_dir="), ({"seed": 1.5}, "seed")]
)
def test_config_refuses_what_gpt2_cannot_do(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(**kw)
