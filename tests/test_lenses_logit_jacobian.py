"""The logit lens over layers and the Jacobian lens (interp_gpt.lenses): their definitions checked on their
own (the model's logits, the older one-prompt logit lens, finite differences, identities), their bad inputs,
and parity with transformer-lens 4.3's `logit_lens` and `JacobianLens.fit` on a raw TransformerBridge built
offline from the same random Hugging Face GPT-2 (skipped where transformer-lens is older than 4.3)."""

from __future__ import annotations

import re
import sys
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, Config, from_pretrained_no_processing
from interp_gpt.inspect import logit_lens as cache_logit_lens
from interp_gpt.lenses import JacobianLens, jacobian_lens, logit_lens, readout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tl_bridge import word_level_bridge  # noqa: E402


def _tl_at_least_4_3() -> bool:
    try:
        found = re.match(r"(\d+)\.(\d+)", version("transformer-lens"))
    except PackageNotFoundError:
        return False
    return found is not None and (int(found[1]), int(found[2])) >= (4, 3)


needs_tl_4_3 = pytest.mark.skipif(
    not _tl_at_least_4_3(),
    reason="logit_lens / JacobianLens are transformer-lens 4.3's: the .venv (TL 4.3) checks this",
)


def _model(n_layers: int = 3, dtype: torch.dtype = torch.float32, seed: int = 0) -> GPT:
    """A small GPT with every bias and LayerNorm weight perturbed and weights large enough that the
    blocks matter (GPT-2's 0.02 init leaves every Jacobian close to the identity)."""
    model = GPT(Config(n_layers=n_layers, d_model=32, n_heads=4, d_vocab=50, n_ctx=40, seed=seed))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.1 if not name.split(".")[-1].startswith("W_") else 4.0
            p.add_(scale * torch.randn(p.shape, generator=gen)) if scale == 0.1 else p.mul_(scale)
    return model.to(dtype).eval()


def _ids(lengths: tuple[int, ...], d_vocab: int = 50, seed: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, d_vocab, (n,), generator=gen) for n in lengths]


# ----------------------------------------------------------------------------
# the logit lens
# ----------------------------------------------------------------------------
def test_logit_lens_last_entry_is_the_model_and_every_entry_the_one_prompt_lens(tiny_model, tiny_tokens):
    result = logit_lens(tiny_model, tiny_tokens, positions=None)
    n = tiny_model.cfg.n_layers
    assert result.values.shape == (n + 1, *tiny_tokens.shape, tiny_model.cfg.d_vocab)
    assert result.labels == [f"{i}_pre" for i in range(n)] + ["final_post"]
    assert result.positions == list(range(tiny_tokens.shape[1]))
    with torch.no_grad():
        logits, cache = tiny_model.run_with_cache(tiny_tokens)
    torch.testing.assert_close(result.values[-1], logits, atol=1e-5, rtol=1e-5)
    for b in range(tiny_tokens.shape[0]):
        want, labels = cache_logit_lens(cache, batch=b)  # the older, one-prompt logit lens
        torch.testing.assert_close(result.values[:, b], want, atol=1e-5, rtol=1e-5)
        assert labels == result.labels


def test_logit_lens_positions_select_as_transformer_lens_slice(tiny_model, tiny_tokens):
    every = logit_lens(tiny_model, tiny_tokens, positions=None, incl_mid=True).values
    n = tiny_model.cfg.n_layers
    assert every.shape[0] == 2 * n + 1
    last = logit_lens(tiny_model, tiny_tokens, incl_mid=True)  # default -1: the pos axis is dropped
    assert last.values.shape == (2 * n + 1, tiny_tokens.shape[0], tiny_model.cfg.d_vocab)
    assert last.positions == [tiny_tokens.shape[1] - 1] and last.labels[:3] == ["0_pre", "0_mid", "1_pre"]
    torch.testing.assert_close(last.values, every[:, :, -1], atol=1e-6, rtol=1e-6)
    picked = logit_lens(tiny_model, tiny_tokens, positions=[1, -2], incl_mid=True)
    assert picked.positions == [1, tiny_tokens.shape[1] - 2]
    torch.testing.assert_close(picked.values, every[:, :, [1, -2]], atol=1e-6, rtol=1e-6)
    sliced = logit_lens(tiny_model, tiny_tokens, positions=(2, 5), incl_mid=True)
    assert sliced.positions == [2, 3, 4]
    torch.testing.assert_close(sliced.values, every[:, :, 2:5], atol=1e-6, rtol=1e-6)
    top = sliced.top_tokens(2)
    assert top.shape == sliced.values.shape[:-1] + (2,)
    assert torch.equal(top[..., 0], sliced.values.argmax(dim=-1))


def test_logit_lens_bad_inputs_say_what_was_expected(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match=r"positions=7 is out of range: the prompts have 7 positions, 0\.\.6"):
        logit_lens(tiny_model, tiny_tokens, positions=7)
    with pytest.raises(ValueError, match=r"positions \[9\] are out of range"):
        logit_lens(tiny_model, tiny_tokens, positions=[0, 9])
    with pytest.raises(ValueError, match=r"selects none of the prompts' 7 positions"):
        logit_lens(tiny_model, tiny_tokens, positions=(5, 5))
    with pytest.raises(TypeError, match=r"positions=1\.5: expected None, an int"):
        logit_lens(tiny_model, tiny_tokens, positions=1.5)
    with pytest.raises(TypeError, match=r"tokens must be a string, a non-empty list of strings or a tensor"):
        logit_lens(tiny_model, [])
    with pytest.raises(TypeError, match=r"model must be an interp_gpt GPT, got str"):
        logit_lens("gpt2", tiny_tokens)
    with pytest.raises(
        ValueError, match=r"logit_lens: tokens: token id 100 at \[batch, posn\] = \[0, 1\] is out of range"
    ):
        logit_lens(tiny_model, torch.tensor([[1, 100]]))
    attn_only = GPT(Config(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, attn_only=True))
    with pytest.raises(ValueError, match=r"incl_mid=True, but an attention-only model has no resid_mid"):
        logit_lens(attn_only, torch.tensor([[1, 2]]), incl_mid=True)
    with pytest.raises(
        ValueError, match=r"top_tokens: k=0 is out of range: top-k sizes \(up to d_vocab\) are 1\.\.100"
    ):
        logit_lens(tiny_model, tiny_tokens).top_tokens(0)


# ----------------------------------------------------------------------------
# the Jacobian lens: its definition, on its own
# ----------------------------------------------------------------------------
def _summed_target(model: GPT, ids: torch.Tensor, layer: int, skip: int, delta: torch.Tensor) -> torch.Tensor:
    """sum over valid targets t' of resid_post of the last layer, with `delta` added to resid_post of `layer` at
    every valid source position: the full forward pass, no trimming (positions skip..len-2 are valid)."""
    valid = slice(skip, ids.shape[0] - 1)

    def shift(resid: torch.Tensor, hook) -> torch.Tensor:  # type: ignore[no-untyped-def]
        resid = resid.clone()
        resid[:, valid] += delta
        return resid

    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with torch.no_grad():
        store = {}
        with model.hooks(
            fwd_hooks=[(f"blocks.{layer}.hook_resid_post", shift), (last, lambda t, hook: store.update(t=t))]
        ):
            model(ids[None], return_type=None)
    return store["t"][0, valid].sum(dim=0)


def test_jacobian_lens_equals_finite_differences_of_its_definition():
    """J[l] column j = d/d eps of sum_{t' in V} h_{L-1,t'} with eps e_j added at every t in V, over |V|
    (causality keeps only t' >= t), averaged over prompts: central differences in float64."""
    model = _model(3, torch.float64)
    prompts, skip = _ids((9, 12)), 3
    lens = jacobian_lens(model, prompts, skip_first_positions=skip, dim_batch=5)
    assert lens.source_layers == [0, 1] and lens.n_prompts == 2 and lens.J.dtype == torch.float32
    eps, d = 1e-5, model.cfg.d_model
    for i, layer in enumerate(lens.source_layers):
        want = torch.zeros(d, d, dtype=torch.float64)
        for ids in prompts:
            n_valid = ids.shape[0] - 1 - skip
            for j in range(d):
                e = torch.zeros(d, dtype=torch.float64)
                e[j] = eps
                diff = _summed_target(model, ids, layer, skip, e) - _summed_target(model, ids, layer, skip, -e)
                want[:, j] += diff / (2 * eps) / n_valid
        want /= len(prompts)
        assert (want - torch.eye(d)).abs().max() > 0.2  # far from the identity (the logit lens)
        torch.testing.assert_close(lens.J[i].double(), want, atol=1e-5, rtol=1e-5)


def test_jacobian_lens_is_the_identity_where_no_block_above_writes():
    model = _model(3, torch.float64)
    with torch.no_grad():
        block = model.blocks[2]
        for p in (block.attn.W_O, block.attn.b_O, block.mlp.W_out, block.mlp.b_out):
            p.zero_()
    lens = jacobian_lens(model, _ids((10,)), skip_first_positions=2)
    torch.testing.assert_close(lens.J[1], torch.eye(32), atol=1e-6, rtol=1e-6)
    assert (lens.J[0] - torch.eye(32)).abs().max() > 0.2
    assert torch.equal(lens.matrix(-1), torch.eye(32)) and torch.equal(lens.matrix(1), lens.J[1])


def test_jacobian_lens_does_not_depend_on_dim_batch_and_leaves_the_weights_as_they_were():
    model = _model(3)
    model.blocks[1].mlp.W_in.requires_grad_(False)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    prompts = _ids((8, 11, 9))
    lenses = [jacobian_lens(model, prompts, skip_first_positions=2, dim_batch=b) for b in (1, 7, 32, 100)]
    for other in lenses[1:]:
        torch.testing.assert_close(other.J, lenses[0].J, atol=1e-5, rtol=1e-5)
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    one = jacobian_lens(model, prompts, skip_first_positions=2, source_layers=[-2])
    assert one.source_layers == [1]
    torch.testing.assert_close(one.J[0], lenses[0].J[1], atol=1e-5, rtol=1e-5)
    batch = jacobian_lens(model, torch.stack([p[:8] for p in prompts]), skip_first_positions=2, max_seq_len=8)
    cut = jacobian_lens(model, prompts, skip_first_positions=2, max_seq_len=8)
    torch.testing.assert_close(batch.J, cut.J, atol=1e-6, rtol=1e-6)


def test_jacobian_lens_with_the_identity_is_the_logit_lens(tiny_model, tiny_tokens):
    n, d = tiny_model.cfg.n_layers, tiny_model.cfg.d_model
    lens = JacobianLens(tiny_model, torch.eye(d).expand(n - 1, d, d), list(range(n - 1)), n_prompts=1)
    want = logit_lens(tiny_model, tiny_tokens, positions=None).values
    with torch.no_grad():
        _, cache = tiny_model.run_with_cache(tiny_tokens)
    for layer in range(n):  # resid_post of layer l is resid_pre of l + 1 (entry l + 1); the last is final_post
        got = lens(cache[f"blocks.{layer}.hook_resid_post"], layer)
        torch.testing.assert_close(got, want[layer + 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(readout(tiny_model, cache["blocks.0.hook_resid_pre"]), want[0], atol=1e-5, rtol=1e-5)


def test_jacobian_lens_reads_text_as_the_model_tokenizes_it():
    model = GPT.from_pretrained("tiny-gpt2")
    text = ["The cat sat on the mat because it was tired.", "A dog ran after the ball in the park today."]
    from_text = jacobian_lens(model, text, skip_first_positions=3)
    from_ids = jacobian_lens(model, [model.to_tokens(t)[0] for t in text], skip_first_positions=3)
    assert torch.equal(from_text.J, from_ids.J) and from_text.J.abs().max() > 0


def test_jacobian_lens_bad_inputs_say_what_was_expected(tiny_model):
    prompts = _ids((9,), d_vocab=100)
    fit = lambda **kw: jacobian_lens(tiny_model, kw.pop("prompts", prompts), **kw)  # noqa: E731
    with pytest.raises(
        ValueError, match=r"source_layers has 1: source layers are 0\.\.0 .* the last layer, 1, is the target"
    ):
        fit(source_layers=[1])
    with pytest.raises(ValueError, match=r"source_layers has 5: source layers are 0\.\.0"):
        fit(source_layers=[5])
    with pytest.raises(ValueError, match=r"source_layers is empty"):
        fit(source_layers=[])
    with pytest.raises(TypeError, match=r"source_layers must be an int, got str"):
        fit(source_layers=["0"])
    with pytest.raises(ValueError, match=r"prompts\[0\] has 9 tokens .* skip_first_positions=8 needs at least 10"):
        fit(skip_first_positions=8)
    with pytest.raises(ValueError, match=r"prompts\[0\] has 4 tokens \(cut to max_seq_len=4\)"):
        fit(max_seq_len=4)
    with pytest.raises(ValueError, match=r"prompts is empty"):
        fit(prompts=[])
    with pytest.raises(ValueError, match=r"dim_batch=0 is out of range"):
        fit(dim_batch=0)
    with pytest.raises(ValueError, match=r"skip_first_positions=-1 is out of range"):
        fit(skip_first_positions=-1)
    with pytest.raises(TypeError, match=r"prompts\[0\] is a tensor of shape \(9,\) and dtype torch.float32"):
        fit(prompts=[torch.zeros(9)])
    with pytest.raises(ValueError, match=r"prompts\[0\]: token id 100 is out of range"):
        fit(prompts=[torch.tensor([1, 2, 100])])
    with pytest.raises(TypeError, match=r"prompts must be a list of strings"):
        fit(prompts=5)
    with pytest.raises(ValueError, match=r"has 40 tokens, longer than the context of 32"):
        fit(prompts=[torch.zeros(40, dtype=torch.long)], max_seq_len=64)
    lens = fit(skip_first_positions=2)
    with pytest.raises(ValueError, match=r"layer=3 has no matrix: the lens has source layers \[0\]"):
        lens(torch.zeros(64), 3)
    with pytest.raises(ValueError, match=r"resid has shape \(2, 5\) .* expected a float tensor \[\.\.\., 64\]"):
        lens(torch.zeros(2, 5), 0)
    with pytest.raises(ValueError, match=r"J has shape \(2, 64, 64\), expected \(1, 64, 64\)"):
        JacobianLens(tiny_model, torch.zeros(2, 64, 64), [0], 1)
    one_layer = GPT(Config(n_layers=1, d_model=16, n_heads=2, d_vocab=20, n_ctx=8))
    with pytest.raises(ValueError, match=r"the model has 1 layer"):
        jacobian_lens(one_layer, [torch.tensor([1, 2, 3])], skip_first_positions=0)


# ----------------------------------------------------------------------------
# parity with transformer-lens 4.3 (a raw TransformerBridge of the same random checkpoint)
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():  # type: ignore[no-untyped-def]
    """Ours and transformer-lens 4.3's raw bridge of one random 3-layer Hugging Face GPT-2, with a word-level
    tokenizer ("t7" is id 7, BOS 49 first) so both read the same ids from text."""
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")

    cfg = transformers.GPT2Config(
        n_layer=3, n_head=4, n_embd=32, n_positions=40, n_ctx=40, vocab_size=50, bos_token_id=49, eos_token_id=49
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith(".weight"):
                p.mul_(5.0)  # GPT-2's 0.02 init leaves every Jacobian close to the identity
    hf.eval()
    bridge = word_level_bridge(hf, "interp_gpt-lenses-test", compatibility=False)
    return from_pretrained_no_processing(hf, tokenizer=None).eval(), bridge


@needs_tl_4_3
@pytest.mark.parametrize("positions", [-1, None, [1, 3], (2, 6)])
@pytest.mark.parametrize("incl_mid", [False, True])
def test_logit_lens_matches_transformer_lens(pair, positions, incl_mid):
    from transformer_lens.tools.analysis import logit_lens as tl_logit_lens

    ours, bridge = pair
    tokens = torch.randint(0, 49, (2, 9), generator=torch.Generator().manual_seed(1))
    want = tl_logit_lens(bridge, tokens, positions=positions, incl_mid=incl_mid)
    got = logit_lens(ours, tokens, positions=positions, incl_mid=incl_mid)
    assert got.labels == want.labels and got.values.shape == want.values.shape
    torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)


@needs_tl_4_3
@pytest.mark.parametrize(("source_layers", "skip"), [(None, 4), ([1], 0)])
def test_jacobian_lens_matches_transformer_lens(pair, source_layers, skip):
    from transformer_lens.tools.analysis import JacobianLens as TLJacobianLens

    ours, bridge = pair
    gen = torch.Generator().manual_seed(2)
    prompts = [" ".join(f"t{int(i)}" for i in torch.randint(0, 49, (n,), generator=gen)) for n in (12, 7, 20)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = TLJacobianLens.fit(
            bridge, prompts, corpus="test", source_layers=source_layers, skip_first_positions=skip, max_seq_len=16,
            show_progress=False,
        )  # fmt: skip
    ids = [bridge.to_tokens(p)[0] for p in prompts]
    got = jacobian_lens(ours, ids, source_layers=source_layers, skip_first_positions=skip, max_seq_len=16, dim_batch=6)
    assert got.source_layers == want.source_layers and got.n_prompts == want.n_prompts == 3
    for i, layer in enumerate(got.source_layers):
        assert want.jacobians[layer].abs().max() > 1.0
        torch.testing.assert_close(got.J[i], want.jacobians[layer], atol=1e-4, rtol=1e-4)
    h = torch.randn(5, 32, generator=gen)
    layer = got.source_layers[-1]
    want_logits = (bridge.ln_final(want.transport(h, layer)[None]) @ bridge.W_U + bridge.b_U)[0]
    torch.testing.assert_close(got(h, layer), want_logits.detach(), atol=1e-4, rtol=1e-4)
