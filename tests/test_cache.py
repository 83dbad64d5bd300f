"""ActivationCache: indexing, residual-stream decomposition, head and neuron results, LayerNorm
scaling and logit attribution.

Two kinds of checks:
  * identities our own forward pass must satisfy (the parts of a decomposition sum to the
    residual stream they decompose, ...), on unprocessed ("LN") and processed ("LNPre") weights;
  * parity: every method gives transformer-lens' result and labels on the same random GPT-2
    checkpoint (3.9's HookedTransformer or 4.x's TransformerBridge, whichever is installed).
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY

from interp_gpt import GPT, ActivationCache, Config, from_pretrained, from_pretrained_no_processing

ATOL = 1e-5
N_LAYERS, N_HEADS, D_MLP = 2, 4, 256  # the tiny shape of conftest.TINY (d_mlp = 4 * d_model)


def close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(a, b, atol=atol, rtol=atol)


# ----------------------------------------------------------------------------
# Models and caches for the identity checks (no transformer-lens needed)
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["unprocessed", "processed"])
def model(request):
    """conftest's tiny model (LayerNorm weights and biases perturbed), as is or processed."""
    tiny = GPT(Config(**TINY))
    tiny.init_weights(seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in tiny.named_parameters():
            if not name.split(".")[-1].startswith("W_"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    if request.param == "unprocessed":
        return tiny.eval()
    return from_pretrained(tiny.state_dict(), config=tiny.cfg, tokenizer=None).eval()


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(3))


@pytest.fixture
def run(model, tokens):
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return logits, cache


@pytest.fixture
def cache(run) -> ActivationCache:
    return run[1]


# ----------------------------------------------------------------------------
# The mapping
# ----------------------------------------------------------------------------
def test_mapping_protocol(cache):
    names = list(cache.cache_dict)
    assert list(cache.keys()) == names == list(cache)
    assert len(cache) == len(names) and "blocks.1.attn.hook_z" in cache and ("z", -1) in cache
    assert all(v is cache[k] for k, v in cache.items())
    assert [id(v) for v in cache.values()] == [id(cache[k]) for k in names]
    assert cache.to("cpu") is cache and cache["resid_pre", 0].device.type == "cpu"


def test_missing_activation_says_what_is_cached_and_how_to_fix(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter=["hook_embed", "blocks.0.hook_resid_pre"])
    with pytest.raises(KeyError, match=r"hook_pos_embed.*hook_embed.*names_filter"):
        cache.decompose_resid()
    with pytest.raises(KeyError, match=r"did you mean"):
        cache["blocks.0.hook_resid_prr"]


def test_layer_out_of_range_names_the_layers(cache):
    for call in (
        lambda: cache.accumulated_resid(3),
        lambda: cache.decompose_resid(-4),
        lambda: cache.stack_head_results(7),
        lambda: cache.stack_neuron_results(3),
        lambda: cache.stack_activation("z", 5),
        lambda: cache.apply_ln_to_stack(cache.decompose_resid(), 3),
    ):
        with pytest.raises(ValueError, match=r"layers are 0\.\.1"):
            call()
    with pytest.raises(ValueError, match="mlp_input"):
        cache.decompose_resid(mlp_input=True)  # the unembed has no MLP


def test_apply_ln_without_the_scale_names_the_hook(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: "scale" not in n)
    cache.decompose_resid()  # no LayerNorm needed
    with pytest.raises(KeyError, match=r"ln_final\.hook_scale.*names_filter"):
        cache.decompose_resid(apply_ln=True)
    with pytest.raises(KeyError, match=r"blocks\.1\.ln2\.hook_scale"):
        cache.accumulated_resid(1, mlp_input=True, apply_ln=True)


def test_bad_slices_and_mismatched_stacks_are_reported(cache):
    with pytest.raises(TypeError, match="pos_slice"):
        cache.decompose_resid(pos_slice=1.5)
    with pytest.raises(ValueError, match="pos_slice"):
        cache.decompose_resid(pos_slice=(0, 1, 1, 1))
    with pytest.raises(ValueError, match=r"pos_slice=None"):  # a stack sliced at -1, scaled as if whole
        cache.apply_ln_to_stack(cache.decompose_resid(pos_slice=-1))
    with pytest.raises(ValueError, match="same shape"):
        cache.logit_attrs(cache.decompose_resid(pos_slice=-1), torch.tensor([1, 2]), 3, pos_slice=-1)
    with pytest.raises(ValueError, match="out of range"):
        cache.logit_attrs(cache.decompose_resid(pos_slice=-1), 100, pos_slice=-1)


# ----------------------------------------------------------------------------
# Identities of the forward pass
# ----------------------------------------------------------------------------
def test_decompose_resid_sums_to_the_residual_stream(cache):
    for layer in range(N_LAYERS):
        close(cache.decompose_resid(layer).sum(0), cache["resid_pre", layer])
        close(cache.decompose_resid(layer, mlp_input=True).sum(0), cache["resid_mid", layer])
    parts, labels = cache.decompose_resid(return_labels=True)
    close(parts.sum(0), cache["resid_post", -1])
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    attn, mlp = (
        cache.decompose_resid(mode="attn", incl_embeds=False),
        cache.decompose_resid(mode="mlp", incl_embeds=False),
    )
    close(attn.sum(0) + mlp.sum(0) + cache["embed"] + cache["pos_embed"], cache["resid_post", -1])


def test_accumulated_resid_ends_at_the_input_of_ln_final(cache):
    resid, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    for i, name in enumerate(["resid_pre", "resid_mid", "resid_pre", "resid_mid"]):
        assert torch.equal(resid[i], cache[name, i // 2])
    assert torch.equal(resid[-1], cache["resid_post", -1])
    # apply_ln at the end is the logit lens: ln_final (with its w and b, if any) per entry.
    close(cache.accumulated_resid(apply_ln=True)[-1], cache["unembed.hook_in"])
    close(cache.accumulated_resid(1, mlp_input=True, return_labels=True)[0][-1], cache["resid_mid", 1])


def test_apply_ln_scales_components_to_sum_to_the_normalized_stream(cache):
    """Centring is linear, so the LayerNorm-scaled parts sum to that LayerNorm's hook_normalized."""
    close(cache.decompose_resid(apply_ln=True).sum(0), cache["ln_final.hook_normalized"])
    for layer in range(N_LAYERS):
        close(cache.decompose_resid(layer, apply_ln=True).sum(0), cache["normalized", layer, "ln1"])
        close(
            cache.decompose_resid(layer, mlp_input=True, apply_ln=True, pos_slice=-1).sum(0),
            cache["normalized", layer, "ln2"][:, -1],
        )
        close(cache.get_full_resid_decomposition(layer, apply_ln=True).sum(0), cache["normalized", layer, "ln1"])


def test_head_results_sum_with_b_O_to_attn_out(model, cache):
    heads, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{L}H{h}" for L in range(N_LAYERS) for h in range(N_HEADS)]
    for L in range(N_LAYERS):
        close(heads[L * N_HEADS : (L + 1) * N_HEADS].sum(0) + model.blocks[L].attn.b_O, cache["attn_out", L])
    with_rest = cache.stack_head_results(1, incl_remainder=True, pos_slice=(1, 5))
    close(with_rest.sum(0), cache["resid_post", 0][:, 1:5])


def test_compute_head_results_equals_the_forward_hook_result(model, tokens, cache):
    model.set_use_attn_result(True)
    try:
        with torch.no_grad():
            _, with_result = model.run_with_cache(tokens)
    finally:
        model.set_use_attn_result(False)
    assert "blocks.0.attn.hook_result" not in cache
    cache.compute_head_results()
    for L in range(N_LAYERS):
        close(cache["result", L], with_result["result", L])
    close(with_result.stack_head_results(), cache.stack_head_results())


def test_neuron_results_sum_with_b_out_to_mlp_out(model, cache):
    neurons, labels = cache.stack_neuron_results(2, return_labels=True)
    assert neurons.shape == (N_LAYERS * D_MLP, 2, 6, 64) and labels[D_MLP + 3] == "L1N3"
    for L in range(N_LAYERS):
        close(neurons[L * D_MLP : (L + 1) * D_MLP].sum(0) + model.blocks[L].mlp.b_out, cache["mlp_out", L], atol=1e-4)
    one, labels = cache.stack_neuron_results(1, neuron_slice=7, pos_slice=-1, return_labels=True)
    assert labels == ["L0N7"]  # an int keeps the neuron axis (transformer-lens 4.x; 3.9 fails here)
    close(one[0], cache["post", 0][:, -1, 7, None] * model.blocks[0].mlp.W_out[7])
    close(cache.stack_neuron_results(1, incl_remainder=True).sum(0), cache["resid_post", 0], atol=1e-4)


@pytest.mark.parametrize("layer, mlp_input", [(None, False), (0, False), (1, False), (0, True), (1, True)])
@pytest.mark.parametrize("expand_neurons", [True, False])
def test_full_decomposition_sums_to_the_residual_stream(cache, layer, mlp_input, expand_neurons):
    parts, labels = cache.get_full_resid_decomposition(layer, mlp_input, expand_neurons, return_labels=True)
    want = cache["resid_post", -1] if layer is None else cache["resid_mid" if mlp_input else "resid_pre", layer]
    close(parts.sum(0), want, atol=1e-4)
    assert len(labels) == parts.shape[0] and labels[-3:] == ["embed", "pos_embed", "bias"]


def test_logit_attrs_of_the_full_decomposition_sum_to_the_logits(model, run, tokens):
    """The attributions sum to ln_final's normalized output dotted with W_U; with processed weights
    (ln_final's w and b folded into W_U and b_U) that plus b_U is the model's logit."""
    logits, cache = run
    W_U, b_U = model.unembed.W_U.detach(), model.unembed.b_U.detach()
    parts = cache.get_full_resid_decomposition(pos_slice=-1)
    right, wrong = tokens[:, 0], tokens[:, 1]
    attrs = cache.logit_attrs(parts, right, pos_slice=-1)
    close(attrs.sum(0), (cache["ln_final.hook_normalized"][:, -1] * W_U[:, right].T).sum(-1), atol=1e-4)
    if model.cfg.normalization_type == "LN":
        return  # unprocessed: ln_final's w and b sit between the stream and W_U
    close(attrs.sum(0), logits[:, -1].gather(-1, right[:, None])[:, 0] - b_U[right], atol=1e-4)
    diff = cache.logit_attrs(parts, right, incorrect_tokens=wrong, pos_slice=-1).sum(0)
    want = logits[:, -1].gather(-1, right[:, None]) - logits[:, -1].gather(-1, wrong[:, None])
    close(diff, want[:, 0] - (b_U[right] - b_U[wrong]), atol=1e-4)
    # [batch, pos] targets over the whole sequence; [batch] targets broadcast over positions.
    every = cache.logit_attrs(cache.decompose_resid(), tokens).sum(0)
    close(every, logits.gather(-1, tokens[..., None])[..., 0] - b_U[tokens], atol=1e-4)
    per_example = cache.logit_attrs(cache.decompose_resid(), right).sum(0)
    close(per_example, logits.gather(-1, right[:, None, None].expand(2, 6, 1))[..., 0] - b_U[right][:, None], atol=1e-4)


def test_logit_attrs_takes_token_strings(model, cache):
    class OneCharTokenizer:  # "a" -> 0, "b" -> 1, ...
        def encode(self, s):
            return [ord(c) - ord("a") for c in s]

    model.tokenizer = OneCharTokenizer()
    try:
        parts = cache.decompose_resid(pos_slice=-1)
        close(cache.logit_attrs(parts, "d", "b", pos_slice=-1), cache.logit_attrs(parts, 3, 1, pos_slice=-1))
        with pytest.raises(ValueError, match="not one"):
            cache.logit_attrs(parts, "cd", pos_slice=-1)
    finally:
        model.tokenizer = None


def want_positions(pos):
    if pos is None:
        return slice(None)
    return torch.arange(6)[slice(*pos) if isinstance(pos, tuple) else pos]


def test_pos_slice_forms_pick_what_transformer_lens_slice_picks(cache):
    resid = cache["resid_post", -1]
    for pos, want in [
        (-1, resid[:, -1]),
        ((3,), resid[:, :3]),
        ((1, 5), resid[:, 1:5]),
        ((0, 6, 2), resid[:, ::2]),
        ([0, 4], resid[:, [0, 4]]),
        (torch.tensor([5, 1]), resid[:, [5, 1]]),
        (None, resid),
        (torch.tensor([True, False, True, False, False, True]), resid[:, [0, 2, 5]]),
    ]:
        assert torch.equal(cache.accumulated_resid(pos_slice=pos)[-1], want), pos
        close(
            cache.decompose_resid(pos_slice=pos, apply_ln=True).sum(0),
            cache["ln_final.hook_normalized"][:, want_positions(pos)],
        )


def test_batch_slice_in_apply_ln_and_logit_attrs(cache):
    parts = cache.decompose_resid()
    close(cache.apply_ln_to_stack(parts, batch_slice=1), cache.apply_ln_to_stack(parts)[:, 1])
    close(
        cache.apply_ln_to_stack(parts[:, 0], batch_slice=0, has_batch_dim=False), cache.apply_ln_to_stack(parts)[:, 0]
    )
    close(cache.logit_attrs(parts, 5, batch_slice=[1]), cache.logit_attrs(parts, 5)[:, [1]])


def test_stack_activation_and_negative_layers(cache):
    assert torch.equal(cache.stack_activation("pattern"), torch.stack([cache["pattern", 0], cache["pattern", 1]]))
    assert torch.equal(cache.stack_activation("scale", -2, "ln2"), cache["scale", 0, "ln2"][None])
    # -1 (and None) is the whole model; -2 stops before the last block.
    assert torch.equal(cache.decompose_resid(-2), cache.decompose_resid(N_LAYERS - 1))
    assert torch.equal(cache.stack_head_results(-2), cache.stack_head_results(N_LAYERS - 1))
    assert cache.accumulated_resid(-1, return_labels=True)[1][-1] == "final_post"


def test_methods_work_on_a_cache_without_batch_axis(model, tokens):
    with torch.no_grad():
        _, full = model.run_with_cache(tokens[:1])
        _, one = model.run_with_cache(tokens[:1], remove_batch_dim=True)
    assert not one.has_batch_dim
    for name, kwargs in [
        ("accumulated_resid", dict(apply_ln=True, incl_mid=True)),
        ("decompose_resid", dict(layer=1, mlp_input=True, apply_ln=True, pos_slice=(1, 4))),
        ("stack_head_results", dict(apply_ln=True, incl_remainder=True, pos_slice=-1)),
        ("get_full_resid_decomposition", dict(apply_ln=True)),
    ]:
        close(getattr(one, name)(**kwargs), getattr(full, name)(**kwargs)[:, 0])
    close(
        one.logit_attrs(one.decompose_resid(), tokens[0], has_batch_dim=False),
        full.logit_attrs(full.decompose_resid(), tokens[:1])[:, 0],
    )


# ----------------------------------------------------------------------------
# Parity with transformer-lens
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["unprocessed", "processed"])
def both(request, hf_checkpoint_dir):
    """(our cache, transformer-lens' cache, the tokens) for one checkpoint and weight processing."""
    pytest.importorskip("transformer_lens")
    from interp_gpt.compare import to_transformer_lens

    processed = request.param == "processed"
    ours = (from_pretrained if processed else from_pretrained_no_processing)(hf_checkpoint_dir, tokenizer=None)
    tl = to_transformer_lens(hf_checkpoint_dir, processed)
    tokens = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, our_cache = ours.run_with_cache(tokens)
        _, tl_cache = tl.run_with_cache(tokens)
    return our_cache, tl_cache, tokens


def tl_major() -> int:
    from interp_gpt.compare import transformer_lens_major

    return transformer_lens_major()


def same(ours, theirs) -> None:
    if isinstance(theirs, tuple):
        assert ours[1] == theirs[1]  # labels, exactly
        ours, theirs = ours[0], theirs[0]
    assert ours.shape == theirs.shape
    close(ours, theirs.to(ours.dtype))


def _cases(method, **grid):
    """Every combination of the keyword values in `grid`, as pytest params for `method`."""
    import itertools

    keys = list(grid)
    out = []
    for values in itertools.product(*grid.values()):
        kwargs = dict(zip(keys, values, strict=True))
        out.append(pytest.param(method, kwargs, id=f"{method}-" + "-".join(f"{k}={v}" for k, v in kwargs.items())))
    return out


PARITY = (
    _cases(
        "accumulated_resid",
        layer=[None, -1, 0, 1, 2],
        incl_mid=[False, True],
        apply_ln=[False, True],
        pos_slice=[None, (1, 4)],
        return_labels=[True],
    )
    + _cases("accumulated_resid", layer=[None, 1], apply_ln=[True], pos_slice=[-1, [0, 2, 5]])
    + _cases("accumulated_resid", layer=[0, 1], mlp_input=[True], apply_ln=[False, True], return_labels=[True])
    + _cases(
        "decompose_resid",
        layer=[None, -1, 1],
        mode=["all", "attn", "mlp"],
        apply_ln=[False, True],
        pos_slice=[None, -1],
        return_labels=[True],
    )
    + _cases("decompose_resid", layer=[None, 0], apply_ln=[True], pos_slice=[(2,), (0, 6, 2)])
    + _cases(
        "decompose_resid",
        layer=[0, 1],
        mlp_input=[True],
        mode=["all", "attn"],
        apply_ln=[True],
        incl_embeds=[False, True],
        return_labels=[True],
    )
    + _cases("decompose_resid", layer=[1], mlp_input=[True], mode=["mlp"], incl_embeds=[False], return_labels=[True])
    + _cases(
        "stack_head_results",
        layer=[-1, 0, 1, 2],
        incl_remainder=[False, True],
        apply_ln=[False, True],
        return_labels=[True],
    )
    + _cases("stack_head_results", layer=[-1, 1], incl_remainder=[True], apply_ln=[True], pos_slice=[-1, (0, 6, 2)])
    + _cases(
        "stack_neuron_results",
        layer=[-1, 0, 1],
        incl_remainder=[False, True],
        apply_ln=[False, True],
        return_labels=[True],
    )
    + _cases(
        "stack_neuron_results",
        layer=[2],
        neuron_slice=[None, (10, 20), [1, 5, 7], torch.tensor([3, 9])],
        pos_slice=[-1],
        incl_remainder=[True],
        apply_ln=[True],
        return_labels=[True],
    )
    + _cases("stack_activation", activation_name=["pattern", "resid_pre", "z", "post"], layer=[-1, 1])
    + _cases("stack_activation", activation_name=["scale"], layer=[2], sublayer_type=["ln1", "ln2"])
    + _cases(
        "get_full_resid_decomposition",
        layer=[None, 0, 1],
        expand_neurons=[True, False],
        apply_ln=[False, True],
        pos_slice=[None, -1],
        return_labels=[True],
    )
    + _cases(
        "get_full_resid_decomposition",
        layer=[0, 1],
        mlp_input=[True],
        expand_neurons=[True, False],
        apply_ln=[False, True],
        return_labels=[True],
    )
)


@pytest.mark.parametrize("method, kwargs", PARITY)
def test_method_matches_transformer_lens(both, method, kwargs):
    ours, theirs, _ = both
    with torch.no_grad():
        same(getattr(ours, method)(**kwargs), getattr(theirs, method)(**kwargs))


def test_negative_layers_match_transformer_lens_at_the_same_layer(both):
    # transformer-lens reads only -1 as "from the end"; our -2 is its n_layers - 1.
    ours, theirs, _ = both
    with torch.no_grad():
        same(ours.decompose_resid(-2, return_labels=True), theirs.decompose_resid(N_LAYERS - 1, return_labels=True))
        same(
            ours.stack_head_results(-2, return_labels=True), theirs.stack_head_results(N_LAYERS - 1, return_labels=True)
        )
        same(ours.stack_activation("z", -2), theirs.stack_activation("z", N_LAYERS - 1))


def test_compute_head_results_matches_transformer_lens(both):
    ours, theirs, _ = both
    ours.compute_head_results()
    theirs.compute_head_results()
    for L in range(N_LAYERS):
        close(ours["result", L], theirs["result", L])


@pytest.mark.parametrize("layer, mlp_input", [(None, False), (0, False), (1, False), (0, True), (1, True)])
def test_apply_ln_to_stack_matches_transformer_lens(both, layer, mlp_input):
    ours, theirs, _ = both
    stack = ours.decompose_resid()
    with torch.no_grad():
        same(ours.apply_ln_to_stack(stack, layer, mlp_input), theirs.apply_ln_to_stack(stack, layer, mlp_input))
        last = ours.decompose_resid(pos_slice=-1)
        same(
            ours.apply_ln_to_stack(last, layer, mlp_input, pos_slice=-1, batch_slice=[1]),
            theirs.apply_ln_to_stack(last, layer, mlp_input, pos_slice=-1, batch_slice=[1]),
        )
        same(
            ours.apply_ln_to_stack(stack[:, 1], layer, mlp_input, batch_slice=1, has_batch_dim=False),
            theirs.apply_ln_to_stack(stack[:, 1], layer, mlp_input, batch_slice=1, has_batch_dim=False),
        )


def test_logit_attrs_match_transformer_lens(both):
    ours, theirs, tokens = both
    with torch.no_grad():
        for full in (False, True):
            make = (
                (lambda c, **k: c.get_full_resid_decomposition(**k))
                if full
                else (lambda c, **k: c.decompose_resid(**k))
            )
            last = make(ours, pos_slice=-1)
            for args in [(tokens[:, -1],), (tokens[:, -1], tokens[:, 0]), (7, 3), (torch.tensor(7),)]:
                same(ours.logit_attrs(last, *args, pos_slice=-1), theirs.logit_attrs(last, *args, pos_slice=-1))
            every = make(ours)
            same(ours.logit_attrs(every, tokens, tokens.flip(0)), theirs.logit_attrs(every, tokens, tokens.flip(0)))
            same(
                ours.logit_attrs(last, tokens[1:, -1], pos_slice=-1, batch_slice=[1]),
                theirs.logit_attrs(last, tokens[1:, -1], pos_slice=-1, batch_slice=[1]),
            )


def test_tl4_only_cases_match_transformer_lens(both):
    """Two calls transformer-lens 3.9 cannot make (they raise there), which 4.x defines:
    an int neuron_slice keeps the neuron axis; [batch] targets broadcast over positions."""
    if tl_major() < 4:
        pytest.skip(
            "transformer-lens 3.9 raises on an int neuron_slice and on [batch] targets for a "
            "[component, batch, pos] stack; 4.x defines both (checked without it above)"
        )
    ours, theirs, tokens = both
    with torch.no_grad():
        same(
            ours.stack_neuron_results(2, neuron_slice=4, return_labels=True),
            theirs.stack_neuron_results(2, neuron_slice=4, return_labels=True),
        )
        every = ours.decompose_resid()
        same(ours.logit_attrs(every, tokens[:, -1]), theirs.logit_attrs(every, tokens[:, -1]))


def test_apply_slice_to_batch_dim_and_toggle_autodiff_as_in_transformer_lens(tiny_model, tiny_tokens) -> None:
    from interp_gpt.cache import ActivationCache

    _, cache = tiny_model.run_with_cache(tiny_tokens)
    one = cache.apply_slice_to_batch_dim(1)
    assert not one.has_batch_dim
    torch.testing.assert_close(one["pattern", 1], cache["pattern", 1][1])
    kept = cache.apply_slice_to_batch_dim([1])
    assert kept.has_batch_dim and kept["resid_post", 0].shape[0] == 1
    torch.testing.assert_close(kept["resid_post", 0][0], cache["resid_post", 0][1])
    with pytest.raises(ValueError, match="batch_slice=5 is out of range for a batch of 2"):
        cache.apply_slice_to_batch_dim(5)
    with pytest.raises(ValueError, match="no batch axis"):
        one.apply_slice_to_batch_dim(0)
    try:
        with pytest.warns(UserWarning, match="autograd is now off"):
            ActivationCache.toggle_autodiff(False)
        assert not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)
    with pytest.raises(TypeError, match="mode must be True or False"):
        cache.toggle_autodiff("no")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------
# One path per cache, 0-d tensor keys, the order activations were made (issue 28)
# ----------------------------------------------------------------------------
def test_an_activation_is_bit_identical_however_it_was_cached(tiny_model, tiny_tokens):
    """transformer-lens' Main Demo asserts torch.equal between a pattern cached with stop_at_layer and a
    names_filter and the same pattern from a full run: every way of caching takes the same path."""
    _, full = tiny_model.run_with_cache(tiny_tokens)
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z", "blocks.1.hook_resid_post", "blocks.0.mlp.hook_post"]
    for name in names:
        layer = int(name.split(".")[1])
        _, one = tiny_model.run_with_cache(tiny_tokens, names_filter=[name])
        _, stopped = tiny_model.run_with_cache(tiny_tokens, names_filter=[name], stop_at_layer=layer + 1)
        _, early = tiny_model.run_with_cache(tiny_tokens, names_filter=name, return_type=None)
        for other in (one, stopped, early):
            assert torch.equal(other[name], full[name]), name
    _, logits_only = tiny_model.run_with_cache(tiny_tokens, names_filter="unembed.hook_out")
    assert torch.equal(logits_only["unembed.hook_out"], full["unembed.hook_out"])
    # ... and the no-hook forward still agrees with a cache within float error.
    torch.testing.assert_close(tiny_model(tiny_tokens), full["unembed.hook_out"], atol=1e-5, rtol=1e-5)


def test_cache_keys_take_0d_integer_tensors_as_layers(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    for layer in torch.arange(tiny_model.cfg.n_layers):  # as a loop over torch.arange gives them
        assert torch.equal(cache["attn", layer], cache["pattern", int(layer)])
        assert ("resid_post", layer) in cache
    assert torch.equal(cache["scale", torch.tensor(-1), "ln1"], cache["blocks.1.ln1.hook_scale"])
    one = torch.tensor(1)  # and wherever else a layer or head is an argument
    assert torch.equal(tiny_model(tiny_tokens, stop_at_layer=one), tiny_model(tiny_tokens, stop_at_layer=1))
    assert torch.equal(cache.accumulated_resid(layer=one), cache.accumulated_resid(layer=1))
    assert torch.equal(cache.stack_head_results(layer=one), cache.stack_head_results(layer=1))
    assert torch.equal(tiny_model.OV[one, one].AB, tiny_model.OV[1, 1].AB)
    with pytest.raises(KeyError, match="out of range, layers are 0..1"):
        cache["attn", torch.tensor(2)]
    with pytest.raises(KeyError, match="is not an int"):
        cache["attn", torch.tensor(1.0)]


def test_the_cache_keeps_the_order_activations_were_made(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: n.startswith("blocks.0."))
    keys = list(cache)
    assert (
        keys.index("blocks.0.hook_resid_pre")
        < keys.index("blocks.0.ln1.hook_scale")
        < keys.index("blocks.0.attn.hook_q")
    )
    assert keys.index("blocks.0.hook_attn_out") < keys.index("blocks.0.ln2.hook_scale")
    assert keys[-1] == "blocks.0.hook_resid_post"
