"""Activation patching sweeps (against transformer-lens' own `patching` module, on the same
checkpoint, tokens and metric), attribution patching, the patching metrics, and bad input.

Runs under transformer-lens 3.x (HookedTransformer) and 4.x (TransformerBridge in
compatibility mode); the reference sweeps run under torch.no_grad() with their progress
bar off, which changes nothing but their speed (they read the metric with `.item()`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import threading

import pytest
import torch

from interp_gpt import (
    GPT,
    Config,
    HookPoint,
    from_pretrained,
    from_pretrained_no_processing,
    patching,
)
from interp_gpt.metrics import logit_diff, logits_to_ave_logit_diff, normalized_logit_diff

SWEEPS = [
    "resid_pre",
    "resid_mid",
    "attn_out",
    "mlp_out",
    "attn_head_out_by_pos",
    "attn_head_q_by_pos",
    "attn_head_k_by_pos",
    "attn_head_v_by_pos",
    "attn_head_pattern_by_pos",
    "attn_head_pattern_dest_src_pos",
    "attn_head_out_all_pos",
    "attn_head_q_all_pos",
    "attn_head_k_all_pos",
    "attn_head_v_all_pos",
    "attn_head_pattern_all_pos",
]
EVERY = ["attn_head_all_pos_every", "attn_head_by_pos_every", "block_every"]
N_POS = 6
A, B, C = 3, 5, 7  # answer tokens and a token whose log-prob the metric reads everywhere


def tl_style_metric(logits: torch.Tensor) -> torch.Tensor:
    """A metric as a transformer-lens user writes it: a logit difference at the last position,
    plus a term reading every position (so patched copies' early positions matter too)."""
    return (logits[:, -1, A] - logits[:, -1, B]).mean() + 0.1 * logits.log_softmax(-1)[:, :, C].mean()


def _tokens(batch: int, posn: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 100, (batch, posn), generator=torch.Generator().manual_seed(seed))


def _all_hook_points(model: GPT) -> list[HookPoint]:
    return [m for m in model.modules() if isinstance(m, HookPoint)]


def _assert_no_hooks(model: GPT) -> None:
    left = [hp.name for hp in _all_hook_points(model) if hp.fwd_hooks or hp.bwd_hooks]
    assert left == [], f"hooks left attached: {left}"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP's
    thread hand-offs make every small op ~10x slower; restored after this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------
# Fixtures: our model and transformer-lens' from one random checkpoint
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[False, True], ids=["unprocessed", "processed"])
def pair(request, hf_checkpoint_dir):
    """(ours, transformer-lens, clean tokens, corrupted tokens, memo of reference results)."""
    pytest.importorskip("transformer_lens")
    import transformer_lens.patching as tl_patching
    from tqdm.auto import tqdm

    from interp_gpt.compare import to_transformer_lens

    processed = request.param
    ours = (from_pretrained if processed else from_pretrained_no_processing)(hf_checkpoint_dir, tokenizer=None)
    tl = to_transformer_lens(hf_checkpoint_dir, processed)
    # transformer-lens' bar, off for the reference runs (restored after this module).
    mp = pytest.MonkeyPatch()
    mp.setattr(tl_patching, "tqdm", functools.partial(tqdm, disable=True))
    yield ours, tl, _tokens(1, N_POS, 1), _tokens(1, N_POS, 2), {}
    mp.undo()


def _reference(pair, name: str, clean=None, corrupted=None, metric=tl_style_metric) -> torch.Tensor:
    """transformer-lens' `get_act_patch_<name>` on its model (memoised per model)."""
    import transformer_lens.patching as tl_patching

    ours, tl, clean0, corrupted0, memo = pair
    clean = clean0 if clean is None else clean
    corrupted = corrupted0 if corrupted is None else corrupted
    key = (name, tuple(clean.flatten().tolist()), tuple(corrupted.flatten().tolist()), metric)
    if key not in memo:
        fn = getattr(tl_patching, f"get_act_patch_{name}", None)
        if fn is None:
            pytest.skip(f"transformer-lens {_tl_version()} has no patching.get_act_patch_{name}")
        with torch.no_grad():
            _, tl_cache = tl.run_with_cache(clean)
            memo[key] = fn(tl, corrupted, tl_cache, metric)
    return memo[key]


def _tl_version() -> str:
    from interp_gpt.compare import transformer_lens_version

    return transformer_lens_version()


def _ours(pair, name: str, clean=None, corrupted=None, metric=tl_style_metric, **kwargs) -> torch.Tensor:
    ours, _, clean0, corrupted0, _ = pair
    clean = clean0 if clean is None else clean
    corrupted = corrupted0 if corrupted is None else corrupted
    _, cache = ours.run_with_cache(clean)
    return getattr(patching, f"get_act_patch_{name}")(ours, corrupted, cache, metric, progress=False, **kwargs)


# ----------------------------------------------------------------------------
# Parity with transformer-lens
# ----------------------------------------------------------------------------
@pytest.mark.parity
@pytest.mark.parametrize("name", SWEEPS + EVERY)
def test_sweep_matches_transformer_lens(pair, name):
    theirs = _reference(pair, name)
    ours = _ours(pair, name)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == torch.float32
    assert ours.device == theirs.device
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert theirs.abs().max() > 0  # a sweep of zeros would prove nothing


@pytest.mark.parity
@pytest.mark.parametrize(
    "name", ["resid_pre", "attn_head_out_by_pos", "attn_head_pattern_dest_src_pos", "attn_head_v_all_pos"]
)
def test_sweep_matches_transformer_lens_with_a_batch_of_prompts(pair, name):
    """Copies are groups of batch rows; the metric sees one copy's [2, pos, d_vocab] logits."""
    clean, corrupted = _tokens(2, 5, 3), _tokens(2, 5, 4)
    seen = []

    def metric(logits):
        seen.append(tuple(logits.shape))
        return tl_style_metric(logits)

    theirs = _reference(pair, name, clean, corrupted)
    ours = _ours(pair, name, clean, corrupted, metric=metric, batch_size=3)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert set(seen) == {(2, 5, 100)} and len(seen) == ours.numel()


@pytest.mark.parity
def test_generic_activation_patch_with_index_df_and_a_custom_setter_matches_transformer_lens(pair):
    pd = pytest.importorskip("pandas")
    import transformer_lens.patching as tl_patching

    ours, tl, clean, corrupted, _ = pair
    rows = pd.DataFrame([(1, 3), (0, 5), (1, 0), (0, 2)], columns=["layer", "pos"])  # layers interleaved

    def halfway(corrupted_act, index, clean_act):  # a setter we know nothing about
        corrupted_act[:, index[1]] = 0.5 * (corrupted_act[:, index[1]] + clean_act[:, index[1]])
        return corrupted_act

    _, our_cache = ours.run_with_cache(clean)
    with torch.no_grad():
        _, tl_cache = tl.run_with_cache(clean)
        theirs, their_df = tl_patching.generic_activation_patch(
            tl, corrupted, tl_cache, tl_style_metric, halfway, "resid_mid", index_df=rows, return_index_df=True
        )
    mine, my_df = patching.generic_activation_patch(
        ours,
        corrupted,
        our_cache,
        tl_style_metric,
        halfway,
        "resid_mid",
        index_df=rows,
        return_index_df=True,
        progress=False,
        batch_size=3,
    )
    assert mine.shape == theirs.shape == (4,)
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    assert my_df is rows and their_df is rows

    # return_index_df without an index_df: the product of the axes, last fastest, like theirs
    _, df = patching.get_act_patch_attn_head_out_all_pos(
        ours, corrupted, our_cache, tl_style_metric, return_index_df=True, progress=False
    )
    assert list(df.columns) == ["layer", "head"] and df.values.tolist()[:5] == [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0]]


# ----------------------------------------------------------------------------
# Batching: results do not depend on how copies are grouped; the prefix runs once
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["resid_pre", "attn_head_q_by_pos", "attn_head_pattern_dest_src_pos", "attn_head_k_all_pos"]
)
def test_batch_size_does_not_change_results(tiny_model, name):
    clean, corrupted = _tokens(2, 6, 5), _tokens(2, 6, 6)
    _, cache = tiny_model.run_with_cache(clean)
    fn = getattr(patching, f"get_act_patch_{name}")
    results = [
        fn(tiny_model, corrupted, cache, tl_style_metric, batch_size=bs, progress=False) for bs in (1, 7, 10_000)
    ]
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], atol=2e-6, rtol=2e-6)
    assert results[0].abs().max() > 0


def test_layers_before_the_patch_run_once():
    """Count the rows every TransformerBlock processes during a resid_pre sweep.

    Our algorithm: one corrupted run (every block, `batch` rows), then for each layer L one
    batch of `pos` copies (`pos * batch` rows) through blocks L..n_layers-1. So block L sees
    batch + (L + 1) * pos * batch rows; in all, n_layers * batch + pos * batch * n_layers *
    (n_layers + 1) / 2 rows, against n_layers * pos forwards of every block (n_layers**2 *
    pos * batch rows) when each patch reruns the whole model.
    """
    n_layers, n_pos, n_batch = 4, 6, 2
    model = GPT(Config(n_layers=n_layers, d_model=32, n_heads=4, d_vocab=50, n_ctx=16))
    model.init_weights(seed=0)
    clean, corrupted = torch.randint(0, 50, (2, n_batch, n_pos), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(clean)
    rows, calls = [0] * n_layers, [0] * n_layers

    def counter(layer):
        def hook(module, inputs, output):
            rows[layer] += inputs[0].shape[0]
            calls[layer] += 1

        return hook

    handles = [block.register_forward_hook(counter(i)) for i, block in enumerate(model.blocks)]
    try:
        patching.get_act_patch_resid_pre(
            model, corrupted, cache, lambda logits: logits[:, -1, 0].mean(), progress=False
        )
    finally:
        for h in handles:
            h.remove()
    assert rows == [n_batch + (L + 1) * n_pos * n_batch for L in range(n_layers)]
    assert calls == [1 + (L + 1) for L in range(n_layers)]  # one batched forward per patched layer
    total, naive = sum(rows), n_layers * n_layers * n_pos * n_batch
    assert total == n_layers * n_batch + n_pos * n_batch * n_layers * (n_layers + 1) // 2 == 128
    assert total < naive == 192


def test_progress_bar_is_shown_and_can_be_turned_off(tiny_model, tiny_tokens, capsys):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    patching.get_act_patch_mlp_out(tiny_model, tiny_tokens.flip(1), cache, tl_style_metric)
    assert "patching mlp_out" in capsys.readouterr().err
    patching.get_act_patch_mlp_out(tiny_model, tiny_tokens.flip(1), cache, tl_style_metric, progress=False)
    assert "patching" not in capsys.readouterr().err


# ----------------------------------------------------------------------------
# Attribution patching
# ----------------------------------------------------------------------------
def _answer_metric(answers):
    return functools.partial(logit_diff, answer_tokens=answers)


def test_attribution_gradients_equal_autograd(tiny_model):
    clean, corrupted = _tokens(2, 6, 7), _tokens(2, 6, 8)
    metric = _answer_metric(torch.tensor([[A, B], [C, A]]))
    result = patching.attribution_patch(tiny_model, clean, corrupted, metric)
    # 1. d metric / d resid_pre, by running the model from a leaf residual stream (no hooks).
    _, cache = tiny_model.run_with_cache(corrupted)
    for layer in range(tiny_model.cfg.n_layers):
        resid = cache["resid_pre", layer].clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(metric(tiny_model(resid, start_at_layer=layer)), resid)
        torch.testing.assert_close(result.grads[f"blocks.{layer}.hook_resid_pre"], grad, atol=1e-6, rtol=1e-5)
    # 2. Every other activation: backward hooks and a plain .backward().
    names = [n for n in result.grads if not n.endswith("hook_resid_pre")]
    seen = {}

    def save(grad, hook):
        seen[hook.name] = grad.detach().clone()

    with tiny_model.hooks(bwd_hooks=[(n, save) for n in names]):
        metric(tiny_model(corrupted)).backward()
    tiny_model.zero_grad(set_to_none=True)
    assert set(seen) == set(names)
    for n in names:
        torch.testing.assert_close(result.grads[n], seen[n], atol=1e-6, rtol=1e-5, msg=n)
    # 3. The estimate is (clean - corrupted) * grad, summed over what a patch covers.
    _, clean_cache = tiny_model.run_with_cache(clean)
    L, p = 1, 4
    manual = ((clean_cache["resid_pre", L] - cache["resid_pre", L]) * result.grads["blocks.1.hook_resid_pre"])[
        :, p
    ].sum()
    torch.testing.assert_close(result["resid_pre"][L, p], manual, atol=1e-6, rtol=1e-5)
    assert all(p.grad is None for p in tiny_model.parameters())  # attribution left .grad alone


def test_attribution_is_exact_where_the_metric_is_linear(tiny_model):
    """Freeze the final LayerNorm's scale (a hook), and the logits, hence the logit difference,
    are linear in the final residual stream: patching the last layer's mlp_out or resid_post
    then moves the metric by exactly (clean - corrupted) . gradient, the attribution estimate.
    Earlier activations reach the logits through attention and MLPs, so there it is only an
    estimate (checked to differ, so the test cannot pass by comparing a thing with itself)."""
    clean, corrupted = _tokens(1, 6, 9), _tokens(1, 6, 10)

    def metric(logits):  # linear in the logits, reading every position
        return (logits[:, :, A] - logits[:, :, B]).mean()

    freeze_scale = ("ln_final.hook_scale", lambda scale, hook: torch.ones_like(scale))
    last = tiny_model.cfg.n_layers - 1
    with tiny_model.hooks(fwd_hooks=[freeze_scale]), pytest.warns(UserWarning, match="ln_final.hook_scale"):
        result = patching.attribution_patch(tiny_model, clean, corrupted, metric)
        _, clean_cache = tiny_model.run_with_cache(clean)
        exact = {}
        for sweep in ["mlp_out", "resid_post", "resid_pre"]:
            exact[sweep] = (
                patching.generic_activation_patch(
                    tiny_model,
                    corrupted,
                    clean_cache,
                    metric,
                    patching.layer_pos_patch_setter,
                    sweep,
                    ("layer", "pos"),
                    progress=False,
                )
                - result.corrupted_metric
            )
    for sweep in ["mlp_out", "resid_post"]:
        torch.testing.assert_close(result[sweep][last], exact[sweep][last], atol=1e-6, rtol=1e-4)
        assert exact[sweep][last].abs().min() > 2e-5  # every position moves the metric, well above float error
    assert (result["resid_pre"][0] - exact["resid_pre"][0]).abs().max() > 1e-6


def test_attribution_correlates_with_activation_patching(tiny_model):
    """On the conftest tiny model (N(0, 0.02) weights plus 0.1 noise on biases and LayerNorm
    weights: close to linear between the clean and corrupted points) the first-order estimate
    tracks real resid_pre patching: r = 0.999 for these tokens, 0.97..0.9996 over four other
    token pairs we tried. With the weights scaled up 5x / 20x (far from linear) r fell to
    0.24..0.94 / 0.1..0.7, so r > 0.9 separates "tracks" from "does not" with a margin."""
    clean, corrupted = _tokens(1, 6, 11), _tokens(1, 6, 12)
    metric = _answer_metric(torch.tensor([[A, B]]))
    cmp = patching.attribution_vs_activation_patching(tiny_model, clean, corrupted, metric, "resid_pre")
    assert cmp.attribution.shape == cmp.patching.shape == (2, 6)
    assert cmp.correlation > 0.9, cmp
    # Per-position head estimates add up to the all-positions ones (the estimate is linear).
    result = patching.attribution_patch(
        tiny_model, clean, corrupted, metric, sweeps=["attn_head_out_all_pos", "attn_head_out_by_pos"]
    )
    assert set(result.keys()) == {"attn_head_out_all_pos", "attn_head_out_by_pos"}
    torch.testing.assert_close(
        result["attn_head_out_by_pos"].sum(1), result["attn_head_out_all_pos"], atol=1e-6, rtol=1e-5
    )


def test_attribution_shapes_follow_the_sweeps(tiny_model, tiny_tokens):
    metric = _answer_metric(torch.tensor([[A, B], [B, A]]))
    result = patching.attribution_patch(tiny_model, tiny_tokens, tiny_tokens.flip(1), metric)
    n_layers, n_heads, n_pos = 2, 4, tiny_tokens.shape[1]
    expected = {
        "layer": n_layers,
        "pos": n_pos,
        "head": n_heads,
        "head_index": n_heads,
        "dest_pos": n_pos,
        "src_pos": n_pos,
    }
    from interp_gpt.patching.attribution import _ATTRIBUTION_SWEEPS

    for sweep, (_, _, axes, _) in _ATTRIBUTION_SWEEPS.items():
        assert tuple(result[sweep].shape) == tuple(expected[a] for a in axes), sweep
    assert result.clean_metric != result.corrupted_metric


# ----------------------------------------------------------------------------
# Hooks go on every exit path; bad input gets a clear error
# ----------------------------------------------------------------------------
def test_a_metric_that_raises_leaves_no_hook_attached(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)

    def broken(logits):
        raise RuntimeError("metric failed")

    for name in ["resid_pre", "attn_head_pattern_by_pos", "attn_head_v_all_pos"]:
        with pytest.raises(RuntimeError, match="metric failed"):
            getattr(patching, f"get_act_patch_{name}")(tiny_model, tiny_tokens.flip(1), cache, broken, progress=False)
        _assert_no_hooks(tiny_model)
    with pytest.raises(RuntimeError, match="metric failed"):
        patching.attribution_patch(tiny_model, tiny_tokens, tiny_tokens.flip(1), broken)
    _assert_no_hooks(tiny_model)

    def bad_setter(act, index, clean):
        raise IndexError("setter failed")

    with pytest.raises(IndexError, match="setter failed"):
        patching.generic_activation_patch(
            tiny_model, tiny_tokens, cache, tl_style_metric, bad_setter, "z", ("layer", "head"), progress=False
        )
    _assert_no_hooks(tiny_model)


def test_user_hooks_stay_and_apply_once(tiny_model, tiny_tokens):
    """A hook the user attached stays attached, and fires once per patched run: adding a
    vector to blocks.1.hook_resid_pre in every run must equal patching a model with it folded in."""
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    shift = torch.randn(tiny_model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    handles = tiny_model.add_hook("blocks.1.hook_resid_pre", lambda x, hook: x + shift)
    try:
        with pytest.warns(UserWarning, match=r"blocks\.1\.hook_resid_pre"):  # runs unbatched, and says so
            hooked = patching.get_act_patch_resid_mid(
                tiny_model, tiny_tokens.flip(1), cache, tl_style_metric, progress=False
            )
        assert tiny_model.hook_dict["blocks.1.hook_resid_pre"].fwd_hooks  # still there
    finally:
        tiny_model.remove_handles(handles)
    with torch.no_grad():
        tiny_model.blocks[0].mlp.b_out += shift  # the same shift, entering layer 1 through resid_post 0
    try:
        folded = patching.get_act_patch_resid_mid(
            tiny_model, tiny_tokens.flip(1), cache, tl_style_metric, progress=False
        )
    finally:
        with torch.no_grad():
            tiny_model.blocks[0].mlp.b_out -= shift
    # Applied twice (once in the shared prefix, once in the patched run), layer 1 would differ.
    torch.testing.assert_close(hooked, folded, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------
# The user's own hooks see exactly one patched run: no stacked copies, no skipped layers
# ----------------------------------------------------------------------------
MIXED = "blocks.1.hook_resid_mid"  # before layer 1's MLP: after every patch point of layer 0 and most of layer 1


def mean_over_batch(x, hook):
    """A mean ablation over the batch: every row becomes the batch's mean (it mixes rows)."""
    return torch.zeros_like(x) + x.mean(0, keepdim=True)


def _each_patch_alone(model, corrupted, clean_cache, metric, sweep):
    """The reference: one `run_with_hooks` per index with the sweep's setter as the only hook
    of our own, in index order (as transformer-lens runs a sweep)."""
    from interp_gpt.patching.sweeps import SWEEPS as TABLE
    from interp_gpt.utils import get_act_name

    activation, setter, axes, _ = TABLE[sweep]
    n_heads = model.cfg.n_heads
    sizes = {"layer": model.cfg.n_layers, "head": n_heads, "head_index": n_heads}
    shape = [sizes.get(axis, corrupted.shape[1]) for axis in axes]
    values = []
    for index in itertools.product(*[range(n) for n in shape]):
        name = get_act_name(activation, index[0])

        def patch(act, hook, index=index, clean=clean_cache[name]):
            return setter(act, list(index), clean)

        with torch.no_grad():
            values.append(float(metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)]))))
    return torch.tensor(values).reshape(shape)


def _batch_sizes(model):
    """Record the batch axis of every forward (a torch module hook: not a hook point of ours)."""
    sizes = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: sizes.append(args[0].shape[0]), with_kwargs=True)
    return sizes, handle


@pytest.mark.parametrize("attach", ["add_hook", "context"])
@pytest.mark.parametrize("sweep", ["resid_pre", "mlp_out", "attn_head_pattern_by_pos", "attn_head_v_all_pos"])
def test_a_user_hook_that_mixes_the_batch_sees_one_patched_run(tiny_model, sweep, attach):
    clean, corrupted = _tokens(2, 6, 21), _tokens(2, 6, 22)
    _, cache = tiny_model.run_with_cache(clean)
    fn = getattr(patching, f"get_act_patch_{sweep}")
    sizes, counter = _batch_sizes(tiny_model)
    with contextlib.ExitStack() as stack:
        stack.callback(counter.remove)
        if attach == "add_hook":
            handles = tiny_model.add_hook(MIXED, mean_over_batch, is_permanent=True)
            stack.callback(tiny_model.remove_handles, handles)
        else:
            stack.enter_context(tiny_model.hooks(fwd_hooks=[(MIXED, mean_over_batch)]))
        with pytest.warns(UserWarning, match=rf"forward hooks are attached at {re.escape(MIXED)}, so each patch") as w:
            ours = fn(tiny_model, corrupted, cache, tl_style_metric, progress=False)
        assert len(w) == 1
        assert [hp.name for hp in _all_hook_points(tiny_model) if hp.fwd_hooks] == [MIXED]  # the user's, alone
        n_forwards = len(sizes)
        reference = _each_patch_alone(tiny_model, corrupted, cache, tl_style_metric, sweep)
    assert torch.equal(ours, reference)
    # One forward of the user's batch per patch (after the one corrupted run), nothing stacked.
    assert sizes[:n_forwards] == [2] * (1 + ours.numel())
    # The hook matters: without it the numbers differ, well above float error.
    plain = fn(tiny_model, corrupted, cache, tl_style_metric, progress=False)
    assert (plain - reference).abs().max() > 1e-4


def test_without_user_hooks_the_sweep_stays_batched(tiny_model, recwarn):
    clean, corrupted = _tokens(2, 6, 21), _tokens(2, 6, 22)
    _, cache = tiny_model.run_with_cache(clean)
    sizes, counter = _batch_sizes(tiny_model)
    try:
        batched = patching.get_act_patch_resid_pre(tiny_model, corrupted, cache, tl_style_metric, progress=False)
    finally:
        counter.remove()
    assert len(sizes) == 1 + tiny_model.cfg.n_layers  # the corrupted run, then one forward per layer
    assert max(sizes) == 2 * 6  # six copies of the 2-row batch in each
    assert not [w for w in recwarn if "activation patching" in str(w.message)]
    reference = _each_patch_alone(tiny_model, corrupted, cache, tl_style_metric, "resid_pre")
    torch.testing.assert_close(batched, reference, atol=2e-6, rtol=2e-6)


def test_another_threads_context_hooks_do_not_unbatch_the_sweep(tiny_model, recwarn):
    """Hooks a context attaches in another thread fire there only: this thread's sweep stays
    batched, does not warn, and gives the result of a model with no hooks at all."""
    clean, corrupted = _tokens(2, 6, 21), _tokens(2, 6, 22)
    _, cache = tiny_model.run_with_cache(clean)
    plain = patching.get_act_patch_resid_pre(tiny_model, corrupted, cache, tl_style_metric, progress=False)
    attached, done = threading.Event(), threading.Event()

    def other_thread():
        with tiny_model.hooks(fwd_hooks=[(MIXED, mean_over_batch)]):
            attached.set()
            done.wait(30)

    thread = threading.Thread(target=other_thread)
    thread.start()
    sizes, counter = _batch_sizes(tiny_model)
    try:
        assert attached.wait(30) and tiny_model.hook_dict[MIXED].fwd_hooks
        ours = patching.get_act_patch_resid_pre(tiny_model, corrupted, cache, tl_style_metric, progress=False)
    finally:
        counter.remove()
        done.set()
        thread.join()
    assert max(sizes) == 2 * 6
    assert not [w for w in recwarn if "activation patching" in str(w.message)]
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("attach", ["add_hook", "context"])
def test_a_raising_metric_leaves_the_users_hooks_and_no_other(tiny_model, tiny_tokens, attach):
    _, cache = tiny_model.run_with_cache(tiny_tokens)

    def broken(logits):
        raise RuntimeError("metric failed")

    def unchanged(x, hook):
        return None

    handles = tiny_model.add_hook(MIXED, unchanged) if attach == "add_hook" else []
    with contextlib.ExitStack() as stack:
        if attach == "context":
            stack.enter_context(tiny_model.hooks(fwd_hooks=[(MIXED, unchanged)]))
        for name in ["resid_pre", "attn_head_pattern_dest_src_pos", "attn_head_q_all_pos", "block_every"]:
            with pytest.raises(RuntimeError, match="metric failed"), pytest.warns(UserWarning, match=MIXED):
                getattr(patching, f"get_act_patch_{name}")(tiny_model, tiny_tokens, cache, broken, progress=False)
            hooked = [(hp.name, [h.fn for h in hp.fwd_hooks]) for hp in _all_hook_points(tiny_model) if hp.fwd_hooks]
            assert hooked == [(MIXED, [unchanged])], name
            assert not any(hp.bwd_hooks for hp in _all_hook_points(tiny_model))
    tiny_model.remove_handles(handles)
    _assert_no_hooks(tiny_model)


def test_attribution_with_a_batch_mixing_hook_is_exact_where_the_metric_is_linear(tiny_model):
    """Attribution patching runs the clean and the corrupted input in forwards of their own,
    so a user's hook that mixes the batch sees what it sees in a plain run. With the final
    LayerNorm's scale frozen, the last layer's resid_post estimate is then exactly the effect
    of patching each position alone (the reference: one run_with_hooks per position)."""
    clean, corrupted = _tokens(2, 6, 23), _tokens(2, 6, 24)

    def metric(logits):  # linear in the logits
        return (logits[:, :, A] - logits[:, :, B]).mean()

    last = tiny_model.cfg.n_layers - 1
    name = f"blocks.{last}.hook_resid_post"
    user_hooks = [("ln_final.hook_scale", lambda scale, hook: torch.ones_like(scale)), (MIXED, mean_over_batch)]
    with tiny_model.hooks(fwd_hooks=user_hooks):
        result = patching.attribution_patch(tiny_model, clean, corrupted, metric, sweeps=["resid_post"])
        _, clean_cache = tiny_model.run_with_cache(clean)
        with torch.no_grad():
            corrupted_metric = metric(tiny_model(corrupted)).item()
            exact = []
            for pos in range(6):

                def patch(act, hook, pos=pos):
                    return patching.layer_pos_patch_setter(act, [last, pos], clean_cache[name])

                exact.append(metric(tiny_model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])).item())
    exact = [e - corrupted_metric for e in exact]
    assert result.corrupted_metric == pytest.approx(corrupted_metric, abs=1e-6)
    torch.testing.assert_close(result["resid_post"][last], torch.tensor(exact), atol=1e-6, rtol=1e-4)
    assert min(abs(e) for e in exact) > 2e-5


def test_bad_input_errors_name_argument_value_and_expectation(tiny_model, tiny_tokens):
    corrupted = tiny_tokens[:, :6]
    _, cache = tiny_model.run_with_cache(tiny_tokens)  # 7 positions
    with pytest.raises(
        ValueError, match=r"clean_cache\['blocks\.0\.hook_resid_pre'\] has shape \(2, 7, 64\).*\(2, 6, 64\).*same shape"
    ):
        patching.get_act_patch_resid_pre(tiny_model, corrupted, cache, tl_style_metric, progress=False)
    with pytest.raises(ValueError, match=r"corrupted_input has shape \(2, 6\), expected \[2, 7\] \(clean_input's"):
        patching.attribution_patch(tiny_model, tiny_tokens, corrupted, tl_style_metric)

    _, cache = tiny_model.run_with_cache(corrupted)
    with pytest.raises(ValueError, match=r"patching_metric returned a tensor of shape \(2, 6, 100\).*scalar"):
        patching.get_act_patch_attn_out(tiny_model, corrupted, cache, lambda logits: logits, progress=False)
    with pytest.raises(ValueError, match=r"metric returned a tensor of shape \(2,\).*scalar"):
        patching.attribution_patch(tiny_model, corrupted, corrupted.flip(1), lambda logits: logits[:, -1, 0])

    pd = pytest.importorskip("pandas")
    for rows, message in [
        ([(2, 0)], r"index_df row 0: layer=2 is out of range: layers are 0\.\.1"),
        ([(0, 6)], r"index_df row 0: pos=6 is out of range: positions are 0\.\.5"),
        ([(-1, 0)], r"layer=-1 is out of range"),
    ]:
        with pytest.raises(ValueError, match=message):
            patching.get_act_patch_resid_pre(
                tiny_model,
                corrupted,
                cache,
                tl_style_metric,
                index_df=pd.DataFrame(rows, columns=["layer", "pos"]),
                progress=False,
            )
    with pytest.raises(ValueError, match=r"index_df row 1: head=4 is out of range: heads are 0\.\.3"):
        patching.get_act_patch_attn_head_out_all_pos(
            tiny_model,
            corrupted,
            cache,
            tl_style_metric,
            index_df=pd.DataFrame([(0, 3), (1, 4)], columns=["layer", "head"]),
            progress=False,
        )

    _, partial_cache = tiny_model.run_with_cache(corrupted, names_filter=lambda n: n.endswith("hook_resid_pre"))
    with pytest.raises(KeyError, match=r"clean_cache has no 'blocks\.0\.hook_attn_out'"):
        patching.get_act_patch_attn_out(tiny_model, corrupted, partial_cache, tl_style_metric, progress=False)
    with pytest.raises(ValueError, match=r"batch_size=0 is out of range: patched copies per forward must be >= 1"):
        patching.get_act_patch_attn_out(tiny_model, corrupted, cache, tl_style_metric, batch_size=0)
    with pytest.raises(TypeError, match=r"batch_size must be an int, got float \(2\.0\)"):
        patching.get_act_patch_attn_out(tiny_model, corrupted, cache, tl_style_metric, batch_size=2.0)
    with pytest.raises(ValueError, match="not both"):
        patching.generic_activation_patch(
            tiny_model,
            corrupted,
            cache,
            tl_style_metric,
            patching.layer_pos_patch_setter,
            "resid_pre",
            ("layer", "pos"),
            index_df=pd.DataFrame([(0, 0)], columns=["layer", "pos"]),
        )
    with pytest.raises(ValueError, match=r"unknown axis 'position'"):
        patching.generic_activation_patch(
            tiny_model,
            corrupted,
            cache,
            tl_style_metric,
            patching.layer_pos_patch_setter,
            "resid_pre",
            ("layer", "position"),
        )
    with pytest.raises(KeyError, match="hook_resid_prw"):
        patching.generic_activation_patch(
            tiny_model,
            corrupted,
            cache,
            tl_style_metric,
            patching.layer_pos_patch_setter,
            "resid_prw",
            ("layer", "pos"),
            progress=False,
        )
    with pytest.raises(ValueError, match=r"corrupted_tokens: token id \d+ .*out of range"):
        patching.get_act_patch_resid_pre(tiny_model, corrupted + 50, cache, tl_style_metric, progress=False)
    _assert_no_hooks(tiny_model)


# ----------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------
def test_logit_diff_reads_the_last_position():
    logits = torch.zeros(2, 3, 10)
    logits[0, -1, 4], logits[0, -1, 6] = 2.0, -1.0  # prompt 0: 2 - (-1) = 3
    logits[1, -1, 6], logits[1, 0, 4] = 0.5, 9.0  # prompt 1: 0 - 0.5 (position 0 ignored)
    answers = torch.tensor([[4, 6], [4, 6]])
    assert logit_diff(logits, answers).item() == pytest.approx(1.25)
    assert logits_to_ave_logit_diff(logits, answers, per_prompt=True).tolist() == [3.0, -0.5]


def test_normalized_logit_diff_is_zero_on_corrupted_and_one_on_clean():
    answers = torch.tensor([[1, 2]])
    clean, corrupted, halfway = (torch.zeros(1, 2, 5) for _ in range(3))
    clean[0, -1, 1], corrupted[0, -1, 2], halfway[0, -1, 1] = 4.0, 2.0, 1.0  # ld: 4, -2, 1
    metric = normalized_logit_diff(answers, clean, corrupted)
    assert metric(clean).item() == pytest.approx(1.0)
    assert metric(corrupted).item() == pytest.approx(0.0)
    assert metric(halfway).item() == pytest.approx(0.5)
    assert normalized_logit_diff(answers, 4.0, -2.0)(halfway).item() == pytest.approx(0.5)


def test_metric_bad_input():
    with pytest.raises(ValueError, match=r"answer_tokens: expected an integer tensor \[batch, 2\].*\(2, 3\)"):
        logit_diff(torch.zeros(2, 3, 10), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"answer_tokens has 1 rows but logits has batch 2"):
        logit_diff(torch.zeros(2, 3, 10), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token id 10 is out of range for d_vocab=10"):
        logit_diff(torch.zeros(1, 3, 10), torch.tensor([[10, 0]]))
    with pytest.raises(ValueError, match=r"same logit difference \(1\)"):
        normalized_logit_diff(torch.tensor([[0, 1]]), 1.0, 1.0)
