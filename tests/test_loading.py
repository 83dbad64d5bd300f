"""Loading GPT-2 checkpoints from every source, weight processing, and bad checkpoints.

The references are a random Hugging Face GPT2LMHeadModel (see conftest.py) and
transformer-lens' HookedTransformer built from it offline.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tl_gpt2  # noqa: E402

from interp_gpt import (  # noqa: E402
    GPT,
    CheckpointError,
    Config,
    from_pretrained,
    from_pretrained_no_processing,
    save_hf_checkpoint,
)

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.parity

TINY = dict(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32)  # conftest's tiny shape

TOKENS = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(5))


def hf_logits(hf_model, tokens: torch.Tensor = TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(tokens).logits


def logits(model, tokens: torch.Tensor = TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)


def assert_same_log_probs(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-4) -> None:
    torch.testing.assert_close(a.log_softmax(-1), b.log_softmax(-1), atol=atol, rtol=atol)


# ----------------------------------------------------------------------------
# transformer-lens models, built offline from the HF model
# ----------------------------------------------------------------------------
def make_tl_model(hf_model, processed: bool):  # type: ignore[no-untyped-def]
    pytest.importorskip("transformer_lens")
    from interp_gpt.compare import transformer_lens_major

    if transformer_lens_major() >= 4:
        pytest.skip(
            "transformer-lens 4.x has no HookedTransformer: these cases run in CI's 3.9 venv "
            "(the 4.x TransformerBridge as a source is tested by test_transformer_bridge_is_a_source)"
        )
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    cfg = tl_gpt2.tl_config(hf_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # HookedTransformer is deprecated in 3.9
        model = HookedTransformer(cfg)
    flags = dict(
        fold_ln=processed, center_writing_weights=processed, center_unembed=processed, fold_value_biases=processed
    )
    model.load_and_process_state_dict(convert_gpt2_weights(hf_model, cfg), **flags)
    return model.eval()


@pytest.fixture(scope="module")
def tl_model(hf_model):  # type: ignore[no-untyped-def]
    return make_tl_model(hf_model, processed=False)


@pytest.fixture(scope="module")
def tl_processed(hf_model):  # type: ignore[no-untyped-def]
    return make_tl_model(hf_model, processed=True)


# ----------------------------------------------------------------------------
# Against Hugging Face
# ----------------------------------------------------------------------------
def test_unprocessed_load_gives_hf_logits(hf_checkpoint_dir, hf_model):
    model = from_pretrained_no_processing(hf_checkpoint_dir)
    assert model.cfg.normalization_type == "LN"
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads, model.cfg.d_vocab, model.cfg.n_ctx) == (
        2,
        64,
        4,
        100,
        32,
    )
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_processed_load_gives_hf_log_probs(hf_checkpoint_dir, hf_model):
    model = from_pretrained(hf_checkpoint_dir)
    assert_same_log_probs(logits(model), hf_logits(hf_model))


def test_processed_weights_have_the_documented_properties(hf_checkpoint_dir):
    model = from_pretrained(hf_checkpoint_dir)
    sd = model.state_dict()
    assert model.cfg.normalization_type == "LNPre"
    assert not any(k.endswith((".w", ".b")) and ("ln" in k) for k in sd), "LayerNorm weights survived fold_ln"

    def centred(t: torch.Tensor, dim: int) -> bool:
        return bool(t.mean(dim).abs().max() < 1e-6)

    assert centred(model.W_E, -1) and centred(model.W_pos, -1)  # along d_model
    assert centred(model.W_O, -1) and centred(model.W_out, -1) and centred(model.b_O, -1)
    assert centred(model.W_U, -1)  # along the vocabulary
    assert centred(model.W_Q, -2) and centred(model.W_in, -2)  # fold_ln centres the reading weights
    assert (model.b_V == 0).all()
    assert not (model.b_O == 0).all()  # b_V went into b_O


@pytest.mark.parametrize("flag", ["fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases"])
def test_each_processing_flag_alone_keeps_log_probs(hf_checkpoint_dir, hf_model, flag):
    flags = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    model = from_pretrained(hf_checkpoint_dir, **{**flags, flag: True})
    raw = from_pretrained_no_processing(hf_checkpoint_dir)
    assert any(not torch.equal(a, raw.state_dict()[k]) for k, a in model.state_dict().items() if k in raw.state_dict())
    assert_same_log_probs(logits(model), hf_logits(hf_model))


def test_processing_leaves_the_residual_stream_decomposition_intact(hf_checkpoint_dir, hf_model):
    # Processing changes weights, not what the LayerNorms see after centring: hook_scale agrees.
    raw = from_pretrained_no_processing(hf_checkpoint_dir)
    processed = from_pretrained(hf_checkpoint_dir)
    _, a = raw.run_with_cache(TOKENS)
    _, b = processed.run_with_cache(TOKENS)
    for name in [
        "blocks.0.ln1.hook_scale",
        "blocks.1.ln2.hook_scale",
        "ln_final.hook_scale",
        "blocks.1.attn.hook_pattern",
    ]:
        torch.testing.assert_close(a[name], b[name], atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------
def test_folder_with_pytorch_model_bin(hf_checkpoint_dir, hf_model, tmp_path):
    shutil.copy(hf_checkpoint_dir / "config.json", tmp_path / "config.json")
    torch.save(hf_model.state_dict(), tmp_path / "pytorch_model.bin")
    model = from_pretrained_no_processing(tmp_path)
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_old_style_bin_with_unprefixed_keys_and_attn_buffers(hf_checkpoint_dir, hf_model, tmp_path):
    # OpenAI's gpt2 pytorch_model.bin: no "transformer." prefix, no lm_head, causal-mask buffers.
    shutil.copy(hf_checkpoint_dir / "config.json", tmp_path / "config.json")
    sd = {k.removeprefix("transformer."): v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    for L in range(2):
        sd[f"h.{L}.attn.bias"] = torch.ones(1, 1, 32, 32).tril()
        sd[f"h.{L}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(sd, tmp_path / "pytorch_model.bin")
    model = from_pretrained_no_processing(tmp_path)
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_folder_with_sharded_safetensors(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    model = from_pretrained_no_processing(tmp_path)
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_single_safetensors_file_with_config_beside_it(hf_checkpoint_dir, hf_model):
    model = from_pretrained_no_processing(hf_checkpoint_dir / "model.safetensors")
    assert model.cfg.n_heads == 4  # read from config.json, not guessed
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_bare_weights_file_without_config_infers_it(tmp_path, hf_gpt2_factory):
    # Without config.json n_heads is inferred from GPT-2's d_head of 64: use a 64-wide, 1-head model.
    hf = hf_gpt2_factory(n_head=1, n_embd=64, seed=7)
    path = tmp_path / "weights.safetensors"
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}, str(path)
    )
    model = from_pretrained_no_processing(path)
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads, model.cfg.d_vocab, model.cfg.n_ctx) == (
        2,
        64,
        1,
        100,
        32,
    )
    torch.testing.assert_close(logits(model), hf_logits(hf), atol=1e-4, rtol=1e-4)


def test_bare_pt_file_without_config(tmp_path, hf_gpt2_factory):
    hf = hf_gpt2_factory(n_head=1, n_embd=64, seed=8)
    torch.save(hf.state_dict(), tmp_path / "gpt2.pt")
    model = from_pretrained_no_processing(tmp_path / "gpt2.pt")
    torch.testing.assert_close(logits(model), hf_logits(hf), atol=1e-4, rtol=1e-4)


def test_transformers_model_object(hf_model):
    model = from_pretrained_no_processing(hf_model)
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)
    assert_same_log_probs(logits(from_pretrained(hf_model)), hf_logits(hf_model))


def test_transformers_base_model_without_lm_head_uses_tied_unembedding(hf_model):
    model = from_pretrained_no_processing(hf_model.transformer)  # a GPT2Model
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_our_state_dict_is_a_source(tiny_model):
    model = from_pretrained_no_processing(tiny_model.state_dict())
    assert model.cfg.n_heads == 4 and model.cfg.d_head == 16
    torch.testing.assert_close(logits(model), logits(tiny_model), atol=1e-6, rtol=1e-6)
    assert_same_log_probs(logits(from_pretrained(tiny_model.state_dict())), logits(tiny_model), atol=1e-5)


def test_transformer_lens_model_object(tl_model, hf_model):
    model = from_pretrained_no_processing(tl_model)
    torch.testing.assert_close(logits(model), logits(tl_model), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits(model), hf_logits(hf_model), atol=1e-4, rtol=1e-4)


def test_processed_transformer_lens_model_and_state_dict(tl_processed, hf_model):
    for source in (tl_processed, tl_processed.state_dict()):
        model = from_pretrained_no_processing(source)
        assert model.cfg.normalization_type == "LNPre"
        torch.testing.assert_close(logits(model), logits(tl_processed), atol=1e-5, rtol=1e-5)
        assert_same_log_probs(logits(model), hf_logits(hf_model))
        # Processing an already processed model again changes nothing.
        torch.testing.assert_close(logits(from_pretrained(source)), logits(tl_processed), atol=1e-5, rtol=1e-5)


def test_processed_load_matches_transformer_lens_processed_weights(hf_checkpoint_dir, tl_processed):
    ours = from_pretrained(hf_checkpoint_dir).state_dict()
    theirs = {k: v for k, v in tl_processed.state_dict().items() if not k.endswith((".IGNORE", ".mask"))}
    assert set(theirs) == {k for k in ours if not k.endswith((".IGNORE", ".mask"))}
    for k, v in theirs.items():
        torch.testing.assert_close(ours[k], v, atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("chunk", [7, 64])
def test_processing_in_chunks_matches_transformer_lens(hf_checkpoint_dir, tl_processed, monkeypatch, chunk):
    """process_weights takes W_E by rows and W_U by columns (4,096 at once for GPT-2); with
    chunks of 7 and 64 the 100-token vocabulary is cut into uneven pieces, and center_unembed's
    mean over the whole vocabulary must still be the one transformer-lens takes."""
    import interp_gpt.checkpoints.processing as processing

    monkeypatch.setattr(processing, "_PROCESS_CHUNK", chunk)
    ours = from_pretrained(hf_checkpoint_dir).state_dict()
    for k, v in tl_processed.state_dict().items():
        if not k.endswith((".IGNORE", ".mask")):
            torch.testing.assert_close(ours[k], v, atol=1e-5, rtol=1e-4, msg=k)
    W_U = ours["unembed.W_U"]
    assert W_U.mean(-1).abs().max() < 1e-6 and ours["unembed.b_U"].mean().abs() < 1e-6


def test_every_hook_matches_transformer_lens(hf_checkpoint_dir, tl_model):
    ours = from_pretrained_no_processing(hf_checkpoint_dir)
    _, a = ours.run_with_cache(TOKENS)
    _, b = tl_model.run_with_cache(TOKENS)
    common = set(a) & set(b)
    assert set(a) - common == set()  # every hook of ours is a transformer-lens hook
    for name in common:
        x, y = a[name], b[name]
        assert x.shape == y.shape, name
        if name.endswith("hook_attn_scores"):  # -inf above the diagonal in both
            assert torch.equal(torch.isneginf(x), torch.isneginf(y)), name
            x, y = x.masked_fill(torch.isneginf(x), 0), y.masked_fill(torch.isneginf(y), 0)
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4, msg=name)


def test_dtype_float64_gives_float64_parameters(hf_checkpoint_dir, hf_model):
    model = from_pretrained(hf_checkpoint_dir, dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    out = logits(model)
    assert out.dtype == torch.float64
    assert_same_log_probs(out.float(), hf_logits(hf_model))


def test_config_argument_is_used_and_not_mutated(hf_checkpoint_dir, hf_model):
    cfg = Config(**TINY)
    model = from_pretrained(hf_checkpoint_dir / "model.safetensors", config=cfg)
    assert model.cfg.normalization_type == "LNPre"
    assert_same_log_probs(logits(model), hf_logits(hf_model))
    # The caller's Config must still describe an unprocessed model (GPT(cfg) is reused often).
    assert cfg.normalization_type == "LN" and cfg.model_name == "custom"


@pytest.mark.parametrize("field, value", [("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False)])
def test_gpt2_config_with_other_attention_scaling_is_matched_or_refused(field, value):
    # Some GPT-2-architecture repos (e.g. stanford-crfm's) set these; loading must not give
    # silently different numbers: either match transformers or raise a CheckpointError naming the field.
    hf_cfg = transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=100, bos_token_id=0, eos_token_id=0, **{field: value}
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    try:
        model = from_pretrained_no_processing(hf)
    except CheckpointError as e:
        assert field in str(e)
    else:
        torch.testing.assert_close(logits(model), hf_logits(hf), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------
# State dicts move both ways between us and transformer-lens
# ----------------------------------------------------------------------------
def test_transformer_lens_state_dict_loads_into_ours_strictly(tl_model):
    ours = GPT(Config(**TINY))
    ours.load_state_dict(tl_model.state_dict(), strict=True)
    torch.testing.assert_close(logits(ours), logits(tl_model), atol=1e-5, rtol=1e-5)


def test_our_state_dict_loads_into_transformer_lens_strictly(tiny_model, hf_model):
    theirs = make_tl_model(hf_model, processed=False)
    theirs.load_state_dict(tiny_model.state_dict(), strict=True)
    torch.testing.assert_close(logits(theirs), logits(tiny_model), atol=1e-5, rtol=1e-5)


def test_processed_state_dicts_move_both_ways(tl_processed, hf_checkpoint_dir, hf_model):
    ours = from_pretrained(hf_checkpoint_dir)
    fresh = GPT(Config(**TINY, normalization_type="LNPre"))
    fresh.load_state_dict(tl_processed.state_dict(), strict=True)
    torch.testing.assert_close(logits(fresh), logits(tl_processed), atol=1e-5, rtol=1e-5)

    theirs = make_tl_model(hf_model, processed=True)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(logits(theirs), logits(ours), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------
def test_save_hf_checkpoint_round_trips_through_transformers(tiny_model, tmp_path):
    with torch.no_grad():
        tiny_model.unembed.b_U.zero_()  # HF GPT-2's lm_head has no bias (see the next test)
    save_hf_checkpoint(tiny_model, tmp_path / "ckpt")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ckpt").eval()
    torch.testing.assert_close(hf_logits(hf), logits(tiny_model), atol=1e-4, rtol=1e-4)
    again = from_pretrained_no_processing(tmp_path / "ckpt")
    torch.testing.assert_close(logits(again), logits(tiny_model), atol=1e-6, rtol=1e-6)
    # A 100-token vocabulary has no GPT-2 end-of-text id 50256: its last id stands in.
    assert (hf.config.bos_token_id, hf.config.eos_token_id) == (99, 99)


def test_save_hf_checkpoint_refuses_to_drop_a_nonzero_b_U(tiny_model, tmp_path):
    # HF GPT-2's lm_head has no bias, so a model with a (non-constant) b_U cannot be saved
    # faithfully; dropping it silently changes every logit.
    assert tiny_model.unembed.b_U.std() > 0
    with pytest.raises(ValueError, match="b_U"):
        save_hf_checkpoint(tiny_model, tmp_path / "ckpt")


def test_save_hf_checkpoint_of_a_processed_model_is_refused(hf_checkpoint_dir, tmp_path):
    with pytest.raises(ValueError, match="from_pretrained_no_processing"):
        save_hf_checkpoint(from_pretrained(hf_checkpoint_dir), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_a_refused_save_leaves_an_existing_checkpoint_folder_as_it_was(hf_checkpoint_dir, tmp_path):
    folder = shutil.copytree(hf_checkpoint_dir, tmp_path / "ckpt")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ValueError, match="from_pretrained_no_processing"):
        save_hf_checkpoint(from_pretrained(hf_checkpoint_dir), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ----------------------------------------------------------------------------
# Bad checkpoints
# ----------------------------------------------------------------------------
def _write_checkpoint(folder: Path, src: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", folder / "config.json")
    sd = dict(safetensors_torch.load_file(str(src / "model.safetensors")))
    edit(sd)
    safetensors_torch.save_file(sd, str(folder / "model.safetensors"))
    return folder


def test_missing_unexpected_and_misshaped_tensors_are_each_listed(hf_checkpoint_dir, tmp_path):
    def edit(sd):  # type: ignore[no-untyped-def]
        prefix = "transformer." if "transformer.wte.weight" in sd else ""
        del sd[prefix + "h.0.mlp.c_fc.bias"]
        sd[prefix + "h.1.attn.extra_thing"] = torch.zeros(3)
        sd[prefix + "h.1.attn.c_proj.weight"] = torch.zeros(64, 65)

    folder = _write_checkpoint(tmp_path / "bad", hf_checkpoint_dir, edit)
    with pytest.raises(CheckpointError) as info:
        from_pretrained(folder)
    msg = str(info.value)
    assert "missing" in msg and "h.0.mlp.c_fc.bias" in msg
    assert "unexpected" in msg and "h.1.attn.extra_thing" in msg
    assert "wrong shape" in msg and "h.1.attn.c_proj.weight" in msg and "(64, 65)" in msg


@pytest.mark.parametrize("key", ["blocks.1.attn.W_Q", "blocks.0.attn.W_Q", "blocks.0.mlp.W_in", "pos_embed.W_pos"])
def test_tl_layout_state_dict_with_a_missing_tensor_is_a_checkpoint_error(tiny_model, key):
    sd = tiny_model.state_dict()
    del sd[key]
    with pytest.raises(CheckpointError, match=rf"missing.*{key}"):
        from_pretrained(sd)


def test_tl_layout_state_dict_with_unexpected_and_misshaped_tensors(tiny_model):
    sd = dict(tiny_model.state_dict())
    sd["blocks.1.attn.W_extra"] = torch.zeros(2)
    sd["blocks.1.mlp.b_out"] = torch.zeros(65)
    with pytest.raises(CheckpointError) as info:
        from_pretrained(sd)
    assert "blocks.1.attn.W_extra" in str(info.value) and "blocks.1.mlp.b_out" in str(info.value)


def test_non_gpt2_config_is_a_checkpoint_error(hf_checkpoint_dir, tmp_path):
    folder = tmp_path / "llama"
    shutil.copytree(hf_checkpoint_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"], config["architectures"] = "llama", ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="llama"):
        from_pretrained(folder)


def _touch(path: str) -> None:
    Path(path).write_text("the pickle ran code")


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_touch, (str(self.marker),))


def test_pickled_code_in_a_bin_file_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran.txt"
    path = tmp_path / "evil" / "pytorch_model.bin"
    path.parent.mkdir()
    torch.save({"wte.weight": torch.zeros(2), "x": _Payload(marker)}, path)
    # The payload is live: a plain unpickle runs it.
    torch.load(path, weights_only=False)
    assert marker.exists()
    marker.unlink()

    for source in (path, path.parent):
        with pytest.raises(CheckpointError, match="weights_only"):
            from_pretrained(source)
        assert not marker.exists()


def test_nonexistent_path_is_file_not_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="nope"):
        from_pretrained("./nope/model.safetensors")
    with pytest.raises(FileNotFoundError):
        from_pretrained(tmp_path / "missing_folder")


def test_folder_without_weights_is_file_not_found(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(tmp_path)


def test_unknown_source_type_is_a_type_error():
    with pytest.raises(TypeError, match="source"):
        from_pretrained(42)


def test_hub_id_offline_without_cache_says_how_to_use_a_local_copy(tmp_path, monkeypatch):
    hub_constants = pytest.importorskip("huggingface_hub.constants")
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HOME", str(home))
    with pytest.raises(OSError, match="local copy") as info:
        from_pretrained("gpt2-medium")
    assert "gpt2-medium" in str(info.value) and "HF_HUB_OFFLINE" in str(info.value)


@pytest.mark.parametrize("processed", [False, True], ids=["unprocessed", "processed"])
def test_transformer_bridge_is_a_source(hf_checkpoint_dir, hf_model, processed):
    pytest.importorskip("transformer_lens")
    from interp_gpt.compare import to_transformer_lens, transformer_lens_major

    if transformer_lens_major() < 4:
        pytest.skip("TransformerBridge is transformer-lens 4.x; CI's main venv runs this case")
    bridge = to_transformer_lens(hf_checkpoint_dir, processed=processed)
    ours = from_pretrained_no_processing(bridge)
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = hf_model(tokens).logits.log_softmax(-1)
        torch.testing.assert_close(ours(tokens).log_softmax(-1), want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours(tokens), bridge(tokens), atol=1e-4, rtol=1e-4)


def test_unknown_model_name_lists_the_known_ones(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(OSError, match=r"Known names: .*gpt2-medium.*distilgpt2"):
        from_pretrained("gtp2")


def test_processing_with_every_flag_off_copies_nothing(tiny_model):
    from interp_gpt.loading import process_weights

    sd = {k: v.detach() for k, v in tiny_model.state_dict().items() if "IGNORE" not in k and "mask" not in k}
    before = {k: v.data_ptr() for k, v in sd.items()}
    out = process_weights(sd, tiny_model.cfg, False, False, False, False)
    assert out is sd and {k: v.data_ptr() for k, v in out.items()} == before


def test_processing_replaces_tensors_and_leaves_the_source_model_untouched(tiny_model):
    """In place on the dict (one copy of the weights at a time), never on the tensors it was given."""
    from interp_gpt.loading import process_weights

    sd = {k: v.detach() for k, v in tiny_model.state_dict().items() if "IGNORE" not in k and "mask" not in k}
    originals = {k: v.clone() for k, v in sd.items()}
    cfg = Config(**TINY)
    out = process_weights(sd, cfg)
    assert out is sd and cfg.normalization_type == "LNPre" and "blocks.0.ln1.w" not in out
    for k, v in tiny_model.state_dict().items():
        if k in originals:
            assert torch.equal(v, originals[k]), k
    assert out["blocks.0.attn.W_Q"].dtype == torch.float32


def test_processing_in_place_writes_into_the_given_tensors_with_the_same_result(tiny_model):
    """inplace=True (what from_pretrained uses for weights it read from a file) puts each
    result into the tensor the dict held; the numbers equal those of the default mode."""
    from interp_gpt.loading import process_weights

    def fresh() -> dict[str, torch.Tensor]:
        return {
            k: v.detach().clone() for k, v in tiny_model.state_dict().items() if "IGNORE" not in k and "mask" not in k
        }

    replaced = process_weights(fresh(), Config(**TINY))
    sd = fresh()
    ptrs = {k: v.data_ptr() for k, v in sd.items()}
    out = process_weights(sd, Config(**TINY), inplace=True)
    assert out is sd and sorted(out) == sorted(replaced)
    for k, v in out.items():
        assert v.data_ptr() == ptrs[k], f"{k} was replaced, not written in place"
        assert torch.equal(v, replaced[k]), k


def test_from_pretrained_of_a_model_object_leaves_its_weights_alone(hf_gpt2_factory):
    """Only weights read from a file are processed where they lie; a transformers model's
    own parameters must come through unchanged."""
    hf = hf_gpt2_factory(seed=5)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    model = from_pretrained(hf, tokenizer=None)
    assert model.cfg.normalization_type == "LNPre"
    for k, v in hf.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_processed_load_from_a_folder_equals_processing_the_model_object(hf_gpt2_factory, tmp_path):
    hf = hf_gpt2_factory(seed=6)
    hf.save_pretrained(tmp_path)
    from_folder = from_pretrained(tmp_path, tokenizer=None).state_dict()
    from_object = from_pretrained(hf, tokenizer=None).state_dict()
    assert sorted(from_folder) == sorted(from_object)
    for k in from_folder:
        torch.testing.assert_close(from_folder[k], from_object[k], rtol=0, atol=0, msg=k)


def _mapped_file(t: torch.Tensor) -> str | None:
    """The file whose memory map holds t's data ("" for anonymous memory), from /proc/self/maps."""
    ptr = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= ptr < hi:
            return fields[5].strip() if len(fields) > 5 else ""
    return None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
@pytest.mark.parametrize("chunk", [7, 4096])
def test_safetensors_weights_are_mapped_not_copied(hf_gpt2_factory, tmp_path, monkeypatch, chunk):
    """An unprocessed load from safetensors leaves the weights in the file's map, except the two
    it must copy: W_Q/W_K/W_V (c_attn split per head) and W_U (GPT-2's tied wte, transposed),
    each read through a map of its own (FileReader; chunks of 7 rows cut the 100-token
    vocabulary unevenly). bench/run.py's load rows measure what this saves."""
    import interp_gpt.checkpoints.sources as sources

    monkeypatch.setattr(sources, "_READ_CHUNK", chunk)
    asked: list[str] = []
    for method in ("get", "transposed"):
        original = getattr(sources.FileReader, method)

        def spy(self, key, _original=original):  # type: ignore[no-untyped-def]
            asked.append(key)
            return _original(self, key)

        monkeypatch.setattr(sources.FileReader, method, spy)
    hf = hf_gpt2_factory(seed=7)
    hf.save_pretrained(tmp_path)
    model = from_pretrained_no_processing(tmp_path, tokenizer=None)
    assert asked == ["h.0.attn.c_attn.weight", "h.1.attn.c_attn.weight", "wte.weight"]
    weights_file = str((tmp_path / "model.safetensors").resolve())
    for name, p in model.named_parameters():
        assert p.is_contiguous(), name
        if name.endswith(("W_Q", "W_K", "W_V", "W_U", "b_Q", "b_K", "b_V", "b_U")):
            assert _mapped_file(p) != weights_file, f"{name} should be a copy"
        else:
            assert _mapped_file(p) == weights_file, f"{name} should lie in the file's map"
    assert model.unembed.W_U.untyped_storage().data_ptr() != model.embed.W_E.untyped_storage().data_ptr()
    torch.testing.assert_close(model.unembed.W_U, hf.lm_head.weight.detach().T, rtol=0, atol=0)
    torch.testing.assert_close(
        model.blocks[1].attn.W_V, from_pretrained_no_processing(hf).blocks[1].attn.W_V, rtol=0, atol=0
    )


@pytest.mark.parametrize("source", ["folder", "model", "processed folder"])
def test_a_loaded_state_dict_saves_with_safetensors(hf_gpt2_factory, tmp_path, source):
    """Every parameter is contiguous and none shares memory with another, so
    safetensors.torch.save_file(model.state_dict()) works, and the file loads back."""
    hf = hf_gpt2_factory(seed=13)
    hf.save_pretrained(tmp_path / "ckpt")
    load = from_pretrained if source == "processed folder" else from_pretrained_no_processing
    model = load(hf if source == "model" else tmp_path / "ckpt", tokenizer=None)
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith((".IGNORE", ".mask"))}
    safetensors_torch.save_file(sd, str(tmp_path / "ours.safetensors"))
    again = safetensors_torch.load_file(str(tmp_path / "ours.safetensors"))
    assert sorted(again) == sorted(sd) and all(torch.equal(again[k], v) for k, v in sd.items())


def test_untied_lm_head_in_a_state_dict_of_views_of_one_buffer(hf_gpt2_factory, tmp_path):
    """Some tools save every tensor as a view of one flat buffer (torch.save keeps that), so
    sharing a storage does not mean lm_head is tied to wte: W_U must still be lm_head."""
    hf = hf_gpt2_factory(seed=14)
    hf.config.tie_word_embeddings = False
    with torch.no_grad():
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach() + 0.5 * torch.randn_like(hf.lm_head.weight))
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    flat = torch.cat([v.flatten() for v in sd.values()])
    views, at = {}, 0
    for k, v in sd.items():
        views[k] = flat[at : at + v.numel()].view(v.shape)
        at += v.numel()
    torch.save(views, tmp_path / "flat.pt")
    expected = hf_logits(hf)
    from interp_gpt.loading import config_from_hf

    config = config_from_hf(hf.config.to_dict())  # a bare state dict cannot tell n_heads
    for source in (views, tmp_path / "flat.pt"):
        model = from_pretrained_no_processing(source, tokenizer=None, config=config)
        torch.testing.assert_close(model.unembed.W_U, hf.lm_head.weight.detach().T, rtol=0, atol=0)
        torch.testing.assert_close(logits(model), expected, atol=1e-4, rtol=1e-4)


def test_a_state_dict_of_parameters_that_require_grad_loads_processed(hf_gpt2_factory):
    from interp_gpt.loading import config_from_hf

    hf = hf_gpt2_factory(seed=15)
    model = from_pretrained(dict(hf.named_parameters()), tokenizer=None, config=config_from_hf(hf.config.to_dict()))
    assert all(p.grad_fn is None for p in model.parameters())
    assert_same_log_probs(logits(model), hf_logits(hf))


def test_a_stray_non_tensor_entry_is_a_checkpoint_error(hf_model):
    with pytest.raises(CheckpointError, match="unexpected tensors: step"):
        from_pretrained_no_processing({"step": 3, **hf_model.state_dict()}, tokenizer=None)


def test_editing_loaded_weights_changes_neither_the_other_weights_nor_the_file(hf_gpt2_factory, tmp_path):
    """GPT-2 ties lm_head to wte in the file; our W_U and W_E must still be independent, and
    writing into memory-mapped weights must never write the checkpoint."""
    hf = hf_gpt2_factory(seed=8)
    hf.save_pretrained(tmp_path)
    file_bytes = (tmp_path / "model.safetensors").read_bytes()
    model = from_pretrained_no_processing(tmp_path, tokenizer=None)
    W_E_before = model.embed.W_E.detach().clone()
    with torch.no_grad():
        model.unembed.W_U[:, 3] = 7.0
        model.blocks[0].attn.W_Q.zero_()
    assert torch.equal(model.embed.W_E, W_E_before)
    assert not torch.equal(model.blocks[0].attn.W_K, torch.zeros_like(model.blocks[0].attn.W_K))
    with torch.no_grad():
        model.embed.W_E[5] = -3.0
    assert bool((model.unembed.W_U[:, 5] != -3.0).all()) and bool((model.unembed.W_U[:, 3] == 7.0).all())
    assert (tmp_path / "model.safetensors").read_bytes() == file_bytes
    again = from_pretrained_no_processing(tmp_path, tokenizer=None)  # a new load sees the file's weights
    torch.testing.assert_close(again.embed.W_E, W_E_before, rtol=0, atol=0)
    # Processing writes every weight in place: the file stays as it was.
    from_pretrained(tmp_path, tokenizer=None)
    assert (tmp_path / "model.safetensors").read_bytes() == file_bytes


@pytest.mark.parametrize("source", ["model", "state_dict"])
def test_unprocessed_load_of_an_object_shares_no_memory_with_it(hf_gpt2_factory, source):
    """Editing the loaded model must not edit the transformers model (or state dict) it came from."""
    hf = hf_gpt2_factory(seed=9)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    model = from_pretrained_no_processing(hf if source == "model" else hf.state_dict(), tokenizer=None)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    for k, v in hf.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("chunk", [7, 64, 4096])
def test_processing_in_pieces_equals_each_step_over_the_whole_model(hf_gpt2_factory, monkeypatch, chunk):
    """process_weights' pieces (a layer, rows of W_E, columns of W_U) give what the four step
    functions give run over the whole float64 model in turn; chunks of 7 and 64 cut the
    100-token vocabulary unevenly (center_unembed's mean spans every piece)."""
    import interp_gpt.checkpoints.processing
    import interp_gpt.loading as loading

    hf = hf_gpt2_factory(seed=10)
    cfg, sd, _ = loading.load_source(hf)
    whole = {k: v.double() for k, v in sd.items()}
    loading.fold_layer_norm(whole, cfg)
    loading.center_writing_weights(whole, cfg)
    loading.center_unembed(whole)
    loading.fold_value_biases(whole, cfg)
    monkeypatch.setattr(interp_gpt.checkpoints.processing, "_PROCESS_CHUNK", chunk)
    for inplace in (False, True):
        piecewise = loading.process_weights(
            {k: v.clone() for k, v in sd.items()}, dataclasses.replace(cfg), inplace=inplace
        )
        assert sorted(piecewise) == sorted(whole)
        for k, v in whole.items():
            torch.testing.assert_close(piecewise[k], v.float(), atol=1e-6, rtol=1e-6, msg=k)


def test_saving_another_model_over_the_folder_leaves_a_loaded_model_as_it_was(hf_gpt2_factory, tmp_path, monkeypatch):
    """A model loaded from a folder maps its file; save_hf_checkpoint of a different model into
    the same folder must replace the file, never rewrite the pages the first model still reads.
    safetensors 0.8's save_file itself writes a new file; here it is swapped for a writer that
    rewrites an existing file in place (as other writers do), which does change a loaded model."""

    def save_in_place(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        data = safetensors_torch.save(tensors, metadata=metadata)
        with open(filename, "r+b" if Path(filename).exists() else "wb") as f:
            f.write(data)
            f.truncate()

    hf_gpt2_factory(seed=11).save_pretrained(tmp_path)
    first = from_pretrained_no_processing(tmp_path, tokenizer=None)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    expected = first(tokens).detach().clone()
    other = from_pretrained_no_processing(hf_gpt2_factory(seed=12), tokenizer=None)
    with monkeypatch.context() as patch:
        patch.setattr(safetensors_torch, "save_file", save_in_place)
        save_hf_checkpoint(other, tmp_path)
    torch.testing.assert_close(first(tokens), expected, rtol=0, atol=0)
    torch.testing.assert_close(
        from_pretrained_no_processing(tmp_path, tokenizer=None)(tokens), other(tokens), rtol=1e-6, atol=1e-6
    )
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_a_file_replaced_during_the_load_is_refused(hf_gpt2_factory, tmp_path):
    """The loader copies W_Q/W_K/W_V and W_U out of the file after mapping it: if the file was
    replaced in between, mixing weights of two checkpoints must be refused, not done."""
    import os

    from interp_gpt.checkpoints.sources import FileReader

    hf_gpt2_factory(seed=16).save_pretrained(tmp_path / "a")
    hf_gpt2_factory(seed=17).save_pretrained(tmp_path / "b")
    path = tmp_path / "a" / "model.safetensors"
    reader = FileReader([path])
    assert reader.get("h.0.attn.c_attn.weight") is not None
    os.replace(tmp_path / "b" / "model.safetensors", path)
    with pytest.raises(CheckpointError, match="changed while it was being loaded"):
        reader.get("h.0.attn.c_attn.weight")
    with pytest.raises(CheckpointError, match="changed while it was being loaded"):
        reader.transposed("wte.weight")


@pytest.mark.parametrize("normalization_type", ["LN", "LNPre"])
def test_the_loader_expects_the_shapes_model_py_declares(normalization_type):
    """convert.py lists every parameter's shape without importing the model (no import circle);
    the list must be the model's own, or a good checkpoint would be refused (or a bad one taken)."""
    from interp_gpt.checkpoints.convert import _expected_shapes

    cfg = Config(n_layers=3, d_model=48, n_heads=3, d_head=16, d_mlp=80, d_vocab=37, n_ctx=11)
    cfg.normalization_type = normalization_type
    with torch.device("meta"):
        declared = {k: tuple(v.shape) for k, v in GPT(cfg).named_parameters()}
    assert _expected_shapes(cfg) == declared


def test_a_float32_checkpoint_loaded_as_float64_is_processed_in_float64(hf_gpt2_factory, tmp_path):
    """Processing rounds its float64 results to the weights' dtype: widening first keeps them exact."""
    hf = hf_gpt2_factory(seed=21)
    hf.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path, dtype=torch.float64, tokenizer=None)
    assert model.W_E.dtype == torch.float64
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf.double()(tokens).logits.log_softmax(-1)
        ours = model(tokens).log_softmax(-1)
    assert (ours - ref).abs().max() < 1e-10


@pytest.mark.parametrize("processed", [False, True])
def test_weight_surface_matches_transformer_lens(hf_model, hf_checkpoint_dir, processed):
    """b_U, W_E_pos, all_head_labels and accumulated_bias, as transformer-lens 3.9 computes them."""
    tl = make_tl_model(hf_model, processed=processed)
    ours = (from_pretrained if processed else from_pretrained_no_processing)(hf_checkpoint_dir, tokenizer=None)
    with torch.no_grad():
        torch.testing.assert_close(ours.b_U, tl.b_U, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours.W_E_pos, tl.W_E_pos, atol=1e-5, rtol=1e-4)
        assert ours.all_head_labels() == tl.all_head_labels()
        for ours_fm, tl_fm in ((ours.OV, tl.OV), (ours.QK, tl.QK), (ours.blocks[1].attn.OV, tl.blocks[1].attn.OV)):
            assert ours_fm.shape == tl_fm.shape
            torch.testing.assert_close(ours_fm.AB, tl_fm.AB, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours.blocks[0].attn.QK.AB, tl.blocks[0].attn.QK.AB, atol=1e-5, rtol=1e-4)
        ids = torch.tensor([[1, 2, 3], [4, 5, 99]])
        torch.testing.assert_close(ours.tokens_to_residual_directions(ids), tl.tokens_to_residual_directions(ids))
        torch.testing.assert_close(ours.tokens_to_residual_directions(7), tl.tokens_to_residual_directions(7))
        for layer in range(ours.cfg.n_layers + 1):
            for mlp_input in (False, True) if layer < ours.cfg.n_layers else (False,):
                for mlp_biases in (False, True):
                    torch.testing.assert_close(
                        ours.accumulated_bias(layer, mlp_input, mlp_biases),
                        tl.accumulated_bias(layer, mlp_input, mlp_biases),
                        atol=1e-5,
                        rtol=1e-4,
                    )


def test_accumulated_bias_sums_what_the_residual_stream_took_in(tiny_model):
    """Independent of transformer-lens: entering layer 1 the stream holds layer 0's b_O and b_out."""
    b0 = tiny_model.blocks[0]
    torch.testing.assert_close(tiny_model.accumulated_bias(1), b0.attn.b_O + b0.mlp.b_out)
    torch.testing.assert_close(tiny_model.accumulated_bias(0, mlp_input=True), b0.attn.b_O)
    torch.testing.assert_close(tiny_model.accumulated_bias(1, include_mlp_biases=False), b0.attn.b_O)
    assert tiny_model.W_E_pos.shape == (100 + 32, 64) and tiny_model.all_head_labels()[5] == "L1H1"
    assert tiny_model.tokens_to_residual_directions(torch.tensor([[3, 4]])).shape == (1, 2, 64)
    attn = tiny_model.blocks[1].attn
    torch.testing.assert_close(tiny_model.OV.AB[1, 2], attn.W_V[2] @ attn.W_O[2])
    torch.testing.assert_close(tiny_model.QK.AB[1, 2], attn.W_Q[2] @ attn.W_K[2].T)
    assert tiny_model.OV.shape == (2, 4, 64, 64) and tiny_model.OV.mdim == 16
    torch.testing.assert_close(tiny_model.tokens_to_residual_directions(3), tiny_model.W_U[:, 3])
    with pytest.raises(ValueError, match=r"tokens: token id 100 .* out of range"):
        tiny_model.tokens_to_residual_directions(torch.tensor([100]))
    with pytest.raises(TypeError, match=r"tokens: expected a token string, an int or a tensor of ids, got float"):
        tiny_model.tokens_to_residual_directions(2.0)
    with pytest.raises(ValueError, match=r"layer=3 is out of range"):
        tiny_model.accumulated_bias(3)
    with pytest.raises(ValueError, match=r"layer=2 is out of range"):
        tiny_model.accumulated_bias(2, mlp_input=True)
