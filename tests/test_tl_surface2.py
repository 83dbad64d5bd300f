"""transformer-lens' HookedTransformer surface, part 2: get_token_position, to_str_tokens, n_params,
weight processing as methods, run_with_cache(pos_slice=...) and Slice, has_hooks, cfg.device / dtype.

Each is compared against transformer-lens 3.9's HookedTransformer (the .venv-tl3 venv) and, where
the bridge has the method, 4.3's TransformerBridge in compatibility mode (the main venv), on random
Hugging Face GPT-2s built offline: the parity suite's tiny and odd shapes, and a tiny model with
GPT-2's real 50,257-token vocabulary for the text methods.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.slices import Slice
from interp_gpt.tokenizer import gpt2_tokenizer

transformers = pytest.importorskip("transformers")

# (n_layer, n_head, n_embd, n_ctx, vocab): the parity suite's tiny and odd shapes (tests/test_compare.py).
SHAPES = {"tiny": (2, 4, 64, 32, 100), "odd": (3, 6, 96, 50, 1000)}
NO_HT = "HookedTransformer is transformer-lens 3's (this venv has 4.x): checked in the .venv-tl3 venv"


def _random_gpt2(n_layer: int, n_head: int, n_embd: int, n_ctx: int, vocab: int, seed: int = 0):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_ctx, n_ctx=n_ctx, vocab_size=vocab,
        bos_token_id=vocab - 1, eos_token_id=vocab - 1,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # LayerNorm weights and biases away from (1, 0), so every fold has work to do
        for name, p in hf.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def _tl_major() -> int:
    from interp_gpt.compare import transformer_lens_major

    pytest.importorskip("transformer_lens")
    return transformer_lens_major()


def _hooked_transformer(hf, processed: bool = False):  # type: ignore[no-untyped-def]
    """TL 3.9's HookedTransformer with `hf`'s weights (skips in the 4.x venv)."""
    if _tl_major() >= 4:
        pytest.skip(NO_HT)
    from interp_gpt.compare import to_transformer_lens

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_transformer_lens(hf, processed=processed)


@pytest.fixture(scope="module", params=list(SHAPES))
def hf(request):  # type: ignore[no-untyped-def]
    return _random_gpt2(*SHAPES[request.param])


def _sd_close(ours: dict, theirs: dict, atol: float = 1e-5) -> None:
    assert list(ours) == list(theirs) or set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))
    for k in theirs:
        if theirs[k].is_floating_point():
            torch.testing.assert_close(ours[k], theirs[k], atol=atol, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")


# ----------------------------------------------------------------------------
# Text: to_str_tokens, get_token_position (a 2-layer model with GPT-2's vocabulary)
# ----------------------------------------------------------------------------
PROMPT = "When Mary and John went to the store, John gave a drink to Mary"


@pytest.fixture(scope="module")
def text_models(gpt2_vocab_dir: Path):  # type: ignore[no-untyped-def]
    """(ours, reference): the same random 50,257-vocabulary GPT-2 in interp_gpt and in transformer-lens
    (3.9's HookedTransformer with a Hugging Face GPT-2 tokenizer, or 4.3's bridge)."""
    hf = _random_gpt2(2, 4, 32, 64, 50257)
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=gpt2_tokenizer(gpt2_vocab_dir))
    from interp_gpt.compare import to_transformer_lens

    if _tl_major() >= 4:
        return ours, to_transformer_lens(copy.deepcopy(hf), processed=False)
    vocab = json.loads((gpt2_vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (gpt2_vocab_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    tok = transformers.GPT2TokenizerFast(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line])
    with tempfile.TemporaryDirectory() as folder:  # TL re-loads it by name_or_path (to add a BOS)
        tok.save_pretrained(folder)
        tok = transformers.GPT2TokenizerFast.from_pretrained(folder)
        ref = _hooked_transformer(hf)
        ref.set_tokenizer(tok)
    return ours, ref


def _str_token_inputs(ref) -> list:  # type: ignore[no-untyped-def]
    ids = ref.to_tokens(PROMPT)
    return [
        PROMPT,
        "Hello world",
        ["Hi", PROMPT, "a b c"],
        ids,  # [1, pos]
        ids[0],
        ids[0, 3],  # 0-d
        ids[0].numpy(),
        ids.numpy(),
        ids[0, :, None],  # [pos, 1]
        [ids[0, :4], ids[0, 2:]],
        ["x", ids[0, :3]],
    ]


def test_to_str_tokens_matches_transformer_lens(text_models) -> None:  # type: ignore[no-untyped-def]
    ours, ref = text_models
    for x in _str_token_inputs(ref):
        assert ours.to_str_tokens(x) == ref.to_str_tokens(x), x
    for bos in (True, False):
        assert ours.to_str_tokens(PROMPT, prepend_bos=bos) == ref.to_str_tokens(PROMPT, prepend_bos=bos)
        assert ours.to_str_tokens(["a", PROMPT], bos) == ref.to_str_tokens(["a", PROMPT], bos)
    for side in ("left", "right"):
        assert ours.to_str_tokens(PROMPT, padding_side=side) == ref.to_str_tokens(PROMPT, padding_side=side)


def test_to_str_tokens_of_a_batch_and_of_ids_gives_one_list_per_row(text_models) -> None:  # type: ignore[no-untyped-def]
    ours, ref = text_models
    batch = ours.to_tokens(["Hello world", PROMPT])
    rows = ours.to_str_tokens(batch)
    assert rows == [ref.to_str_tokens(row) for row in batch] and len(rows) == 2 and len(rows[1]) == batch.shape[1]
    assert ours.to_str_tokens(batch.numpy()) == rows
    assert ours.to_str_tokens(batch[0].tolist()) == ref.to_str_tokens(batch[0])  # a list of ints: one sequence
    assert ours.to_str_tokens([]) == []


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (torch.ones(2, 3), TypeError, "integer"),
        (np.ones(3), TypeError, "integer"),
        (torch.zeros(2, 3, 4, dtype=torch.long), ValueError, r"\[pos\] or \[batch, pos\].*\(2, 3, 4\)"),
        ({"a": 1}, TypeError, "input must be a string, a list"),
        (torch.tensor([1, 50257]), ValueError, "50257"),
    ],
)
def test_to_str_tokens_refuses_what_is_not_tokens(text_models, bad, error, match) -> None:  # type: ignore[no-untyped-def]
    ours, _ = text_models
    with pytest.raises(error, match=match):
        ours.to_str_tokens(bad)


def test_get_token_position_matches_transformer_lens(text_models) -> None:  # type: ignore[no-untyped-def]
    ours, ref = text_models
    ids = ref.to_tokens(PROMPT)
    john = ours.to_single_token(" John")
    cases = [
        (" Mary", PROMPT, {}),
        (" Mary", PROMPT, {"mode": "last"}),
        (" John", PROMPT, {"mode": "last", "prepend_bos": False}),
        (john, PROMPT, {}),
        (torch.tensor(john), PROMPT, {"mode": "last"}),
        (" John", ids, {}),
        (" John", ids[0], {"mode": "last"}),
        (john, ids[0], {}),
        (" Mary", PROMPT, {"padding_side": "left"}),
    ]
    for token, prompt, kwargs in cases:
        got = ours.get_token_position(token, prompt, **kwargs)
        assert got == ref.get_token_position(token, prompt, **kwargs), (token, kwargs)
        assert isinstance(got, int)
    assert ours.get_token_position(" Mary", PROMPT) != ours.get_token_position(" Mary", PROMPT, mode="last")


def test_get_token_position_errors_name_the_token_and_show_the_prompt(text_models) -> None:  # type: ignore[no-untyped-def]
    ours, _ = text_models
    with pytest.raises(ValueError, match=r"' Paris' \(id \d+\) does not occur.*'<\|endoftext\|>', 'When', ' Mary'"):
        ours.get_token_position(" Paris", PROMPT)
    with pytest.raises(ValueError, match=r"single_token must be one token.*' Mary Jane' is 2 tokens"):
        ours.get_token_position(" Mary Jane", PROMPT)
    with pytest.raises(ValueError, match="mode must be 'first' or 'last', not 'middle'"):
        ours.get_token_position(" Mary", PROMPT, mode="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shape \[1, seq_len\], not \(2, "):
        ours.get_token_position(" Mary", ours.to_tokens([PROMPT, PROMPT]))
    with pytest.raises(TypeError, match="single_token must be a token id or a string"):
        ours.get_token_position(1.5, PROMPT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="input must be a string or a tensor"):
        ours.get_token_position(" Mary", [1, 2, 3])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------
# n_params, and weight processing as methods (state dict in, state dict out)
# ----------------------------------------------------------------------------
def test_n_params_and_n_params_total_match_transformer_lens(hf) -> None:  # type: ignore[no-untyped-def]
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    assert ours.n_params == ours.cfg.n_params
    d_model, d_vocab = ours.cfg.d_model, ours.cfg.d_vocab  # Hugging Face ties its unembedding and has no b_U
    assert ours.n_params_total == hf.num_parameters() + d_model * d_vocab + d_vocab
    tl = _hooked_transformer(hf)
    assert (ours.n_params, ours.n_params_total) == (tl.cfg.n_params, tl.n_params_total)


METHODS = ["fold_layer_norm", "center_writing_weights", "center_unembed", "fold_value_biases"]


@pytest.mark.parametrize("processed", [False, True])
def test_processing_methods_return_transformer_lens_state_dicts(hf, processed: bool) -> None:  # type: ignore[no-untyped-def]
    tl = _hooked_transformer(hf, processed)
    ours = (GPT.from_pretrained if processed else GPT.from_pretrained_no_processing)(hf, tokenizer=None)
    calls = [(m, {}) for m in METHODS if not (processed and m == "fold_layer_norm")]
    if not processed:
        calls += [("fold_layer_norm", {"fold_biases": False, "center_weights": False})]
        calls += [("fold_layer_norm", {"center_weights": False})]
    for method, kwargs in calls:
        sd_ours, sd_tl = ours.state_dict(), tl.state_dict()
        before = {k: v.clone() for k, v in sd_ours.items()}
        out = getattr(ours, method)(sd_ours, **kwargs)
        _sd_close(out, getattr(tl, method)(sd_tl, **kwargs))
        assert out is not sd_ours and all(torch.equal(sd_ours[k], before[k]) for k in before), method  # input kept
        if not processed:  # (on processed weights some of these change nothing)
            assert any(not torch.equal(out[k], before[k]) for k in before if before[k].is_floating_point()), method
        assert all(torch.equal(p, before[k]) for k, p in ours.state_dict().items()), method  # the model kept


def _same_up_to_column_signs(a: torch.Tensor, b: torch.Tensor, signs: torch.Tensor) -> None:
    """a == b with each [head, :, j] column flipped by signs[head, j]; singular vectors have no fixed sign."""
    torch.testing.assert_close(a * signs[:, None, :], b, atol=2e-4, rtol=1e-3)


def test_refactor_factored_attn_matrices_matches_transformer_lens(hf) -> None:  # type: ignore[no-untyped-def]
    tl = _hooked_transformer(hf)
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    mine, theirs = (
        ours.refactor_factored_attn_matrices(ours.state_dict()),
        tl.refactor_factored_attn_matrices(tl.state_dict()),
    )
    assert set(mine) == set(theirs)
    for L in range(ours.cfg.n_layers):
        a = f"blocks.{L}.attn."
        qk = torch.sign((mine[a + "W_Q"] * theirs[a + "W_Q"]).sum(1))  # [head, d_head]: the SVD's sign choices
        _same_up_to_column_signs(mine[a + "W_Q"], theirs[a + "W_Q"], qk)
        _same_up_to_column_signs(mine[a + "W_K"], theirs[a + "W_K"], qk)
        torch.testing.assert_close(mine[a + "b_Q"] * qk, theirs[a + "b_Q"], atol=2e-4, rtol=1e-3)
        torch.testing.assert_close(mine[a + "b_K"] * qk, theirs[a + "b_K"], atol=2e-4, rtol=1e-3)
        ov = torch.sign((mine[a + "W_V"] * theirs[a + "W_V"]).sum(1))
        _same_up_to_column_signs(mine[a + "W_V"], theirs[a + "W_V"], ov)
        _same_up_to_column_signs(mine[a + "W_O"].transpose(1, 2), theirs[a + "W_O"].transpose(1, 2), ov)
        for k in ("b_V", "b_O"):
            torch.testing.assert_close(mine[a + k], theirs[a + k], atol=1e-5, rtol=1e-4)
    rest = [k for k in theirs if ".attn.W_" not in k and ".attn.b_Q" not in k and ".attn.b_K" not in k]
    _sd_close({k: mine[k] for k in rest}, {k: theirs[k] for k in rest})


def test_refactor_keeps_qk_ov_and_the_logits(tiny_model) -> None:  # type: ignore[no-untyped-def]
    sd = tiny_model.state_dict()
    new = tiny_model.refactor_factored_attn_matrices(sd)
    for L in range(tiny_model.cfg.n_layers):
        a = f"blocks.{L}.attn."

        def qk(s, a=a):  # type: ignore[no-untyped-def]  # the bilinear form with the biases as an extra input
            W_Q = torch.cat([s[a + "W_Q"], s[a + "b_Q"][:, None]], 1)
            W_K = torch.cat([s[a + "W_K"], s[a + "b_K"][:, None]], 1)
            return W_Q @ W_K.transpose(1, 2)

        torch.testing.assert_close(qk(new), qk(sd), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(new[a + "W_V"] @ new[a + "W_O"], sd[a + "W_V"] @ sd[a + "W_O"], atol=1e-5, rtol=1e-4)
        eye = torch.eye(tiny_model.cfg.d_head).expand(tiny_model.cfg.n_heads, -1, -1)
        torch.testing.assert_close(new[a + "W_O"] @ new[a + "W_O"].transpose(1, 2), eye, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(new[a + "W_Q"], sd[a + "W_Q"])
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = tiny_model(tokens)
        tiny_model.load_state_dict(new)
        torch.testing.assert_close(tiny_model(tokens), before, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("refactor", [False, True])
def test_process_weights_in_place_matches_transformer_lens(hf, refactor: bool) -> None:  # type: ignore[no-untyped-def]
    tokens = torch.randint(0, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    tl = _hooked_transformer(hf)
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    tl.process_weights_(refactor_factored_attn_matrices=refactor)
    ours.process_weights_(refactor_factored_attn_matrices=refactor)
    assert ours.cfg.normalization_type == tl.cfg.normalization_type == "LNPre"
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), tl(tokens), atol=1e-4, rtol=1e-4)
    if not refactor:  # (refactored weights agree up to the SVD's signs: the test above)
        theirs = {k: v for k, v in tl.state_dict().items() if ".ln" not in k and not k.startswith("ln_final")}
        _sd_close(ours.state_dict(), theirs)
    _, cache = ours.run_with_cache(tokens)  # the rebuilt LayerNorms' hook points are live
    assert "blocks.0.ln1.hook_scale" in cache and not ours.blocks[0].ln1.has_params


@pytest.mark.parametrize("refactor", [False, True])
def test_process_weights_equals_loading_processed(hf, refactor: bool) -> None:  # type: ignore[no-untyped-def]
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    ours.process_weights_(refactor_factored_attn_matrices=refactor)
    loaded = GPT.from_pretrained(hf, tokenizer=None, refactor_factored_attn_matrices=refactor)
    _sd_close(ours.state_dict(), loaded.state_dict(), atol=1e-5)
    assert ours.cfg == loaded.cfg


def test_load_and_process_state_dict_matches_transformer_lens(hf) -> None:  # type: ignore[no-untyped-def]
    tl = _hooked_transformer(hf)
    raw = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    ours = GPT(dataclasses.replace(raw.cfg))
    ours.load_and_process_state_dict(raw.state_dict(), center_unembed=False)
    tl.load_and_process_state_dict(tl.state_dict(), center_unembed=False)
    theirs = {k: v for k, v in tl.state_dict().items() if ".ln" not in k and not k.startswith("ln_final")}
    _sd_close(ours.state_dict(), theirs)


def test_load_and_process_state_dict_that_does_not_fit_leaves_the_model_as_it_was(tiny_model) -> None:  # type: ignore[no-untyped-def]
    sd = tiny_model.state_dict()
    before = {k: v.clone() for k, v in sd.items()}
    bad = dict(sd)
    del bad["blocks.1.mlp.W_in"]
    bad["blocks.0.attn.W_Q"] = torch.zeros(3, 3)
    with pytest.raises(KeyError, match=r"missing \['blocks.1.mlp.W_in'\].*blocks.0.attn.W_Q \(3, 3\)"):
        tiny_model.load_and_process_state_dict(bad)
    assert tiny_model.cfg.normalization_type == "LN" and tiny_model.blocks[0].ln1.has_params
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.state_dict().items())
    with pytest.raises(TypeError, match="state_dict must be a dict of tensors"):
        tiny_model.fold_layer_norm([1, 2])  # type: ignore[arg-type]
    tiny_model.process_weights_()
    with pytest.raises(KeyError, match="no LayerNorm weights"):
        tiny_model.fold_layer_norm(tiny_model.state_dict())


# ----------------------------------------------------------------------------
# run_with_cache(pos_slice=...), Slice, and the cache methods taking Slice objects
# ----------------------------------------------------------------------------
def _tl_slice():  # type: ignore[no-untyped-def]
    pytest.importorskip("transformer_lens")
    from transformer_lens.utilities.slice import Slice as TLSlice

    return TLSlice


POS_SLICES = [-1, 2, [0, 3, 5], (1, 6), (0, 8, 2), slice(2, None), torch.tensor([1, 4]), np.array([0, 2])]


def test_run_with_cache_pos_slice_matches_transformer_lens(hf) -> None:  # type: ignore[no-untyped-def]
    tokens = torch.randint(0, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(4))
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    if _tl_major() >= 4:
        from interp_gpt.compare import to_transformer_lens

        ref = to_transformer_lens(copy.deepcopy(hf), processed=False)
    else:
        ref = _hooked_transformer(hf)
    TLSlice = _tl_slice()
    pairs = [(s, s) for s in POS_SLICES] + [(Slice(-1), TLSlice(-1)), (Slice((1, 6)), TLSlice((1, 6)))]
    pairs += [(TLSlice([0, 3]), TLSlice([0, 3])), (TLSlice((2, 7)), TLSlice((2, 7)))]
    for i, (pos_slice, theirs_slice) in enumerate(pairs):
        for remove_batch_dim, toks in [(False, tokens), (True, tokens[:1])][: 2 if i % 3 == 0 else 1]:
            _, mine = ours.run_with_cache(toks, pos_slice=pos_slice, remove_batch_dim=remove_batch_dim)
            _, theirs = ref.run_with_cache(toks, pos_slice=theirs_slice, remove_batch_dim=remove_batch_dim)
            assert set(mine) <= set(theirs.keys())
            for k in mine:
                torch.testing.assert_close(mine[k], theirs[k], atol=1e-4, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
    _, mine = ours.run_with_cache(tokens, pos_slice=-1)
    assert mine["resid_pre", 0].shape == (2, 1, ours.cfg.d_model)  # an int keeps the axis, as transformer-lens
    assert mine["pattern", 0].shape == (2, ours.cfg.n_heads, 1, 9)  # the query axis


def test_run_with_cache_pos_slice_cuts_opt_in_hooks_along_positions(tiny_model) -> None:  # type: ignore[no-untyped-def]
    tokens = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    tiny_model.set_use_split_qkv_input(True)
    tiny_model.cfg.use_hook_tokens = True
    tiny_model.setup_hooks()
    _, full = tiny_model.run_with_cache(tokens)
    _, cut = tiny_model.run_with_cache(tokens, pos_slice=[2, 5])
    for name in ("blocks.0.hook_q_input", "blocks.0.ln1.hook_scale", "blocks.0.ln1.hook_normalized", "hook_tokens"):
        assert torch.equal(cut[name], full[name][:, [2, 5]]), name
    _, grads = tiny_model.run_with_cache(tokens, pos_slice=(1, 4), incl_bwd=True, return_type="loss")
    assert grads["blocks.0.attn.hook_pattern_grad"].shape == (2, 4, 3, 9)
    with pytest.raises(TypeError, match="pos_slice=1.5"):
        tiny_model.run_with_cache(tokens, pos_slice=1.5)


def test_our_slice_matches_transformer_lens_slice() -> None:
    TLSlice = _tl_slice()
    x = torch.arange(7 * 7 * 3).reshape(7, 7, 3)
    for s in [None, 3, -1, (2,), (1, 5), (0, 7, 3), slice(1, None, 2), [0, 4, 6], torch.tensor([1, 2]), np.array([5])]:
        ours, theirs = Slice(s), TLSlice(s)
        assert ours.mode == theirs.mode, s
        for dim in (0, 1, -2):
            assert torch.equal(ours.apply(x, dim), theirs.apply(x, dim)), (s, dim)
        assert np.array_equal(ours.indices(7), theirs.indices(7)), s
        assert torch.equal(Slice.unwrap(s).apply(x, 1), TLSlice.unwrap(s).apply(x, 1)), s
    with pytest.raises(ValueError, match="max_ctx"):
        Slice((1, 3)).indices()
    with pytest.raises(TypeError, match="input_slice='a'"):
        Slice("a")  # type: ignore[arg-type]
    assert Slice(np.int64(2)).mode == "int" and Slice(torch.tensor(2)).mode == "int"
    from interp_gpt import utils

    assert utils.Slice is Slice  # where transformer-lens users look for it


SLICED_CALLS = [
    ("accumulated_resid", {"apply_ln": True}),
    ("decompose_resid", {"apply_ln": True}),
    ("stack_head_results", {"apply_ln": True}),
    ("get_full_resid_decomposition", {}),
]


@pytest.mark.parametrize("raw", [-1, (1, 6, 2), [0, 2, 5]])
def test_cache_methods_take_slice_objects_ours_and_transformer_lens(tiny_model, raw) -> None:  # type: ignore[no-untyped-def]
    tokens = torch.randint(0, 100, (3, 8), generator=torch.Generator().manual_seed(1))
    _, cache = tiny_model.run_with_cache(tokens)
    wrapped = [Slice(raw)]
    with contextlib.suppress(pytest.skip.Exception):
        wrapped.append(_tl_slice()(raw))
    for method, kwargs in SLICED_CALLS:
        plain = getattr(cache, method)(pos_slice=raw, **kwargs)
        for s in wrapped:
            assert torch.equal(getattr(cache, method)(pos_slice=s, **kwargs), plain), (method, s)
    for s in wrapped:
        stack = cache.decompose_resid(pos_slice=s)
        assert torch.equal(cache.logit_attrs(stack, 3, pos_slice=s), cache.logit_attrs(stack, 3, pos_slice=raw))
        assert torch.equal(
            cache.stack_neuron_results(1, pos_slice=s, neuron_slice=Slice((0, 9))),
            cache.stack_neuron_results(1, pos_slice=raw, neuron_slice=(0, 9)),
        )
    assert torch.equal(cache.apply_slice_to_batch_dim(Slice([0, 2]))["resid_post", 1], cache["resid_post", 1][[0, 2]])
    one = cache.apply_slice_to_batch_dim(Slice(1))
    assert torch.equal(one["resid_post", 1], cache["resid_post", 1][1]) and not one.has_batch_dim


# ----------------------------------------------------------------------------
# has_hooks as transformer-lens calls it; mod_dict
# ----------------------------------------------------------------------------
def test_has_hooks_answers_transformer_lens_calls_like_its_hook_point() -> None:
    pytest.importorskip("transformer_lens")
    from transformer_lens.hook_points import HookPoint as TLHookPoint

    from interp_gpt import HookPoint

    def fn(x, hook):  # type: ignore[no-untyped-def]
        return None

    setups = [[], [("fwd", False)], [("fwd", True)], [("bwd", False)], [("bwd", True), ("fwd", True)]]
    for setup in setups:
        ours, theirs = HookPoint(), TLHookPoint()
        ours.name = theirs.name = "blocks.0.hook_resid_pre"
        for direction, permanent in setup:
            ours.add_hook(fn, dir=direction, is_permanent=permanent)
            theirs.add_hook(fn, dir=direction, is_permanent=permanent)
        for d in ("fwd", "bwd", "both"):
            for perm in (True, False):
                assert ours.has_hooks(d, perm) == theirs.has_hooks(d, perm), (setup, d, perm)
                assert ours.has_hooks(dir=d, including_permanent=perm) == theirs.has_hooks(
                    dir=d, including_permanent=perm
                )
        assert ours.has_hooks() == theirs.has_hooks() == bool(ours.has_hooks) == bool(setup)


def test_has_hooks_keeps_the_thread_rule_and_refuses_levels(tiny_model) -> None:  # type: ignore[no-untyped-def]
    hp = tiny_model.blocks[0].attn.hook_pattern
    assert not hp.has_hooks and hp.has_hooks() is False
    seen: dict[str, bool] = {}
    ready, done = threading.Event(), threading.Event()

    def other() -> None:
        with tiny_model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: None)]):
            ready.set()
            done.wait(5)

    t = threading.Thread(target=other)
    t.start()
    ready.wait(5)
    seen["truth"], seen["call"] = bool(hp.has_hooks), hp.has_hooks()
    done.set()
    t.join()
    assert seen == {"truth": False, "call": False}  # another thread's context hook does not fire here
    with tiny_model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: None)]):
        assert hp.has_hooks and hp.has_hooks("fwd") and not hp.has_hooks("bwd")
        assert hp.has_hooks == True and repr(hp.has_hooks) == "True"  # noqa: E712
        with pytest.raises(ValueError, match="level=1"):
            hp.has_hooks(level=1)
        with pytest.raises(ValueError, match="dir must be 'fwd', 'bwd' or 'both', got 'up'"):
            hp.has_hooks("up")  # type: ignore[arg-type]
    assert hp.has_hooks == False and repr(hp.has_hooks) == "False"  # noqa: E712


def test_mod_dict_names_every_module_as_transformer_lens(hf) -> None:  # type: ignore[no-untyped-def]
    ours = GPT.from_pretrained_no_processing(hf, tokenizer=None)
    assert set(ours.hook_dict) <= set(ours.mod_dict) and ours.mod_dict["blocks.1.attn"] is ours.blocks[1].attn
    tl = _hooked_transformer(hf)
    assert set(ours.mod_dict) - {"hook_tokens"} == set(tl.mod_dict)  # TL builds hook_tokens only when it is on


# ----------------------------------------------------------------------------
# cfg.device and cfg.dtype
# ----------------------------------------------------------------------------
def test_cfg_device_and_dtype_follow_the_model(tiny_cfg) -> None:  # type: ignore[no-untyped-def]
    model = GPT(tiny_cfg)
    assert (model.cfg.device, model.cfg.dtype) == ("cpu", torch.float32)
    model.to(torch.float64)
    assert model.cfg.dtype == torch.float64 == model.W_E.dtype
    model.half()
    assert model.cfg.dtype == torch.float16
    model.float()
    assert model.cfg.dtype == torch.float32
    loaded = GPT.from_pretrained("tiny-gpt2", dtype="bfloat16")
    assert (loaded.cfg.device, loaded.cfg.dtype) == ("cpu", torch.bfloat16)


def test_a_new_model_goes_where_its_config_says(tiny_cfg) -> None:  # type: ignore[no-untyped-def]
    model = GPT(dataclasses.replace(tiny_cfg, dtype="float64"))
    assert {p.dtype for p in model.parameters()} == {torch.float64} and model.cfg.dtype == torch.float64
    model = GPT(dataclasses.replace(tiny_cfg, device=torch.device("cpu")))
    assert model.cfg.device == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)")
def test_cfg_device_follows_the_model_to_cuda(tiny_cfg) -> None:  # type: ignore[no-untyped-def]
    model = GPT(tiny_cfg).cuda()
    assert model.cfg.device.startswith("cuda") and model.W_E.is_cuda
    assert GPT(dataclasses.replace(tiny_cfg, device="cuda")).W_E.is_cuda
    model.cpu()
    assert model.cfg.device == "cpu"


def test_config_with_device_and_dtype_round_trips_through_json(tiny_cfg) -> None:  # type: ignore[no-untyped-def]
    cfg = dataclasses.replace(tiny_cfg, device="cuda:1", dtype=torch.bfloat16)
    d = json.loads(json.dumps(cfg.to_dict()))
    assert (d["device"], d["dtype"]) == ("cuda:1", "bfloat16")
    assert Config.from_dict(d) == cfg


@pytest.mark.parametrize("bad", ["int32", torch.int64, "float8"])
def test_config_refuses_a_dtype_that_is_no_float(tiny_cfg, bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match=r"Config: dtype=.*expected a floating-point torch.dtype"):
        dataclasses.replace(tiny_cfg, dtype=bad)
    with pytest.raises(TypeError, match="Config: device must be a string"):
        dataclasses.replace(tiny_cfg, device=0)


def test_transformer_lens_helpers_that_read_cfg_device_run_on_our_model(text_models) -> None:  # type: ignore[no-untyped-def]
    ours, ref = text_models
    if _tl_major() >= 4:
        pytest.skip("test_prompt / detect_head on a HookedTransformer-style model: checked in the .venv-tl3 venv")
    from transformer_lens import utils
    from transformer_lens.head_detector import detect_head

    seq = "The cat sat on the mat. The cat sat on the mat."
    for head_type in ("previous_token_head", "duplicate_token_head", "induction_head"):
        torch.testing.assert_close(detect_head(ours, seq, head_type), detect_head(ref, seq, head_type))
    printed = []
    for model in (ours, ref):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            utils.test_prompt("The cat sat on the", " mat", model)
        printed.append(out.getvalue())
    assert printed[0] == printed[1] and "Tokenized prompt" in printed[0]
