"""Hook points: editing activations, name errors, clean-up on every exit path,
nesting, permanent hooks, cache filters, backward hooks and the ActivationCache."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import GPT, HookPoint, get_act_name


def all_hook_points(model: GPT) -> list[HookPoint]:
    """Every HookPoint module, the opt-in ones that are off included."""
    return [m for m in model.modules() if isinstance(m, HookPoint)]


def assert_no_hooks_attached(model: GPT) -> None:
    attached = [hp.name for hp in all_hook_points(model) if hp.fwd_hooks or hp.bwd_hooks]
    assert attached == [], f"hooks left attached on {attached}"


class Boom(Exception):
    pass


def raise_boom(t, hook):
    raise Boom(hook.name)


def raise_keyboard_interrupt(t, hook):
    raise KeyboardInterrupt


# ----------------------------------------------------------------------------
# What a hook function returns
# ----------------------------------------------------------------------------
def test_hook_returning_a_modified_tensor_changes_the_output(tiny_model, tiny_tokens):
    clean = tiny_model(tiny_tokens)
    patched = tiny_model.run_with_hooks(
        tiny_tokens, fwd_hooks=[("blocks.1.hook_mlp_out", lambda t, hook: torch.zeros_like(t))]
    )
    assert not torch.allclose(patched, clean)
    # ...and the change is exactly "MLP 1 removed": recompute the tail by hand.
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    torch.testing.assert_close(
        patched, tiny_model.unembed(tiny_model.ln_final(cache["resid_mid", 1])), atol=1e-6, rtol=1e-6
    )


def test_hook_returning_none_leaves_the_output_unchanged(tiny_model, tiny_tokens):
    calls = []
    out = tiny_model.run_with_hooks(
        tiny_tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: calls.append(hook.name))]
    )
    assert calls == ["blocks.0.attn.hook_pattern"]
    # Compare with a run on the same (explicit-pattern) path: a None hook changes nothing at all.
    same_path = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: t)])
    torch.testing.assert_close(out, same_path, atol=0, rtol=0)


def test_in_place_edit_in_a_hook_changes_the_output(tiny_model, tiny_tokens):
    def zero_head_3(z, hook):
        z[:, :, 3] = 0.0

    out, cache = None, None
    with tiny_model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_head_3)]):
        out, cache = tiny_model.run_with_cache(tiny_tokens)
    assert (cache["z", 1][:, :, 3] == 0).all()
    assert not torch.allclose(out, tiny_model(tiny_tokens))


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_in_place_edits_in_any_hook_never_touch_the_parameters(tiny_model, tiny_tokens, grad):
    # Interpretability code edits activations in place (`z[:, :, 3] = 0`), often under
    # torch.no_grad(). A hook must see a fresh activation, never a view of a weight.
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    failures = {}
    for tokens in (tiny_tokens[:1], tiny_tokens):  # batch of 1 and of 2
        for name in tiny_model.hook_dict:

            def halve(t, hook):
                t.mul_(0.5)

            try:
                with torch.set_grad_enabled(grad):
                    tiny_model.run_with_hooks(tokens, fwd_hooks=[(name, halve)])
            except RuntimeError as e:
                failures[f"{name} (batch {len(tokens)})"] = str(e)[:80]
            changed = [k for k, v in tiny_model.state_dict().items() if not torch.equal(v, before[k])]
            if changed:
                failures[f"{name} (batch {len(tokens)})"] = f"changed {changed}"
                tiny_model.load_state_dict(before)
    assert failures == {}


def test_hook_returning_wrong_shape_names_hook_and_both_shapes(tiny_model, tiny_tokens):
    def bad(t, hook):
        return t[:, :-1]

    with pytest.raises(ValueError, match=r"blocks\.0\.hook_resid_mid.*\(2, 6, 64\).*\(2, 7, 64\)"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_resid_mid", bad)])
    assert_no_hooks_attached(tiny_model)


def test_hook_returning_a_non_tensor_is_a_type_error(tiny_model, tiny_tokens):
    with pytest.raises(TypeError, match=r"blocks\.0\.hook_resid_mid.*list"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_resid_mid", lambda t, hook: [1.0])])


def test_hooks_on_one_point_run_in_order_and_chain(tiny_model, tiny_tokens):
    seen = []

    def double(t, hook):
        return t * 2

    def record(t, hook):
        seen.append(t.clone())

    _, cache = tiny_model.run_with_cache(tiny_tokens)
    tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("hook_embed", double), ("hook_embed", record)])
    torch.testing.assert_close(seen[0], 2 * cache["hook_embed"])


def test_filter_function_attaches_to_every_matching_point(tiny_model, tiny_tokens):
    names = []
    tiny_model.run_with_hooks(
        tiny_tokens, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda t, hook: names.append(hook.name))]
    )
    assert names == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]


# ----------------------------------------------------------------------------
# Unknown names
# ----------------------------------------------------------------------------
def test_misspelt_hook_name_suggests_the_close_one(tiny_model, tiny_tokens):
    with pytest.raises(KeyError, match=r"did you mean.*blocks\.0\.attn\.hook_pattern"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.attn.hook_patern", lambda t, hook: None)])
    assert_no_hooks_attached(tiny_model)


def test_out_of_range_layer_in_hook_name_says_which_layers_exist(tiny_model, tiny_tokens):
    with pytest.raises(KeyError, match=r"layers are 0\.\.1"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.5.attn.hook_pattern", lambda t, hook: None)])
    with pytest.raises(KeyError, match=r"layers are 0\.\.1"):
        tiny_model.add_hook("blocks.2.hook_resid_pre", lambda t, hook: None)


def test_bad_hook_spec_is_a_type_error_and_attaches_nothing(tiny_model, tiny_tokens):
    with pytest.raises(TypeError, match="fwd_hooks"):
        tiny_model.run_with_hooks(
            tiny_tokens, fwd_hooks=[("hook_embed", lambda t, hook: None), "blocks.0.hook_resid_pre"]
        )
    assert_no_hooks_attached(tiny_model)


# ----------------------------------------------------------------------------
# Hooks are removed on every exit path
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "exc, fn",
    [(Boom, raise_boom), (KeyboardInterrupt, raise_keyboard_interrupt)],
    ids=["exception", "KeyboardInterrupt"],
)
def test_hooks_removed_when_a_hook_raises_in_run_with_hooks(tiny_model, tiny_tokens, exc, fn):
    # (backward hooks in run_with_hooks warn that they are gone before any .backward(): expected here)
    with pytest.raises(exc), pytest.warns(UserWarning, match="backward hooks are removed"):
        tiny_model.run_with_hooks(
            tiny_tokens,
            fwd_hooks=[("hook_embed", lambda t, hook: None), ("blocks.1.hook_resid_mid", fn)],
            bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: None)],
        )
    assert_no_hooks_attached(tiny_model)


@pytest.mark.parametrize(
    "exc, fn",
    [(Boom, raise_boom), (KeyboardInterrupt, raise_keyboard_interrupt)],
    ids=["exception", "KeyboardInterrupt"],
)
def test_hooks_removed_when_a_hook_raises_inside_hooks_context(tiny_model, tiny_tokens, exc, fn):
    with pytest.raises(exc):
        with tiny_model.hooks(
            fwd_hooks=[("blocks.0.attn.hook_z", fn)], bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: None)]
        ):
            tiny_model(tiny_tokens)
    assert_no_hooks_attached(tiny_model)


@pytest.mark.parametrize(
    "exc, fn",
    [(Boom, raise_boom), (KeyboardInterrupt, raise_keyboard_interrupt)],
    ids=["exception", "KeyboardInterrupt"],
)
def test_hooks_removed_when_a_hook_raises_inside_run_with_cache(tiny_model, tiny_tokens, exc, fn):
    with pytest.raises(exc):
        with tiny_model.hooks(fwd_hooks=[("ln_final.hook_scale", fn)]):
            tiny_model.run_with_cache(tiny_tokens, incl_bwd=True, return_type="loss")
    assert_no_hooks_attached(tiny_model)


def test_hooks_removed_when_a_backward_hook_raises(tiny_model, tiny_tokens):
    with pytest.raises(Boom):
        with tiny_model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", raise_boom)]):
            tiny_model(tiny_tokens, return_type="loss").backward()
    assert_no_hooks_attached(tiny_model)


def test_run_with_cache_leaves_no_hooks_after_a_normal_run(tiny_model, tiny_tokens):
    tiny_model.run_with_cache(tiny_tokens, return_type="loss", incl_bwd=True)
    assert_no_hooks_attached(tiny_model)


def test_removed_backward_hook_does_not_fire_on_a_later_backward(tiny_model, tiny_tokens):
    calls = []
    with tiny_model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: calls.append(1))]):
        loss = tiny_model(tiny_tokens, return_type="loss")
    loss.backward()  # the context has exited: its backward hook must stay silent
    assert calls == []


# ----------------------------------------------------------------------------
# Nesting and permanent hooks
# ----------------------------------------------------------------------------
def test_leaving_an_inner_hooks_context_restores_exactly_the_outer_hooks(tiny_model, tiny_tokens):
    def outer_fn(t, hook):
        return None

    def inner_fn(t, hook):
        return None

    point = tiny_model.hook_dict["blocks.0.hook_resid_pre"]
    with tiny_model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", outer_fn), ("hook_embed", outer_fn)]):
        before = {hp.name: [h.fn for h in hp.fwd_hooks] for hp in all_hook_points(tiny_model)}
        with tiny_model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", inner_fn), ("hook_pos_embed", inner_fn)]):
            assert [h.fn for h in point.fwd_hooks] == [outer_fn, inner_fn]
        after = {hp.name: [h.fn for h in hp.fwd_hooks] for hp in all_hook_points(tiny_model)}
        assert after == before
        assert [h.fn for h in point.fwd_hooks] == [outer_fn]
    assert_no_hooks_attached(tiny_model)


def test_nested_contexts_apply_both_hooks_while_inside(tiny_model, tiny_tokens):
    scale = lambda k: lambda t, hook: t * k  # noqa: E731
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    seen = []
    with tiny_model.hooks(fwd_hooks=[("hook_embed", scale(2.0))]):
        with tiny_model.hooks(fwd_hooks=[("hook_embed", scale(3.0)), ("hook_embed", lambda t, hook: seen.append(t))]):
            tiny_model(tiny_tokens)
    torch.testing.assert_close(seen[0], 6.0 * cache["hook_embed"])


def test_permanent_hooks_survive_reset_hooks_but_not_including_permanent(tiny_model, tiny_tokens):
    clean = tiny_model(tiny_tokens)
    tiny_model.add_hook("blocks.0.hook_mlp_out", lambda t, hook: torch.zeros_like(t), is_permanent=True)
    tiny_model.add_hook("blocks.1.hook_mlp_out", lambda t, hook: None)
    patched = tiny_model(tiny_tokens)
    assert not torch.allclose(patched, clean)

    tiny_model.reset_hooks()
    assert tiny_model.hook_dict["blocks.1.hook_mlp_out"].fwd_hooks == []
    assert len(tiny_model.hook_dict["blocks.0.hook_mlp_out"].fwd_hooks) == 1
    torch.testing.assert_close(tiny_model(tiny_tokens), patched)
    # A run_with_hooks call must not remove the permanent hook either.
    tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_mlp_out", lambda t, hook: None)])
    assert len(tiny_model.hook_dict["blocks.0.hook_mlp_out"].fwd_hooks) == 1

    tiny_model.reset_hooks(including_permanent=True)
    assert_no_hooks_attached(tiny_model)
    torch.testing.assert_close(tiny_model(tiny_tokens), clean)


def test_reset_hooks_also_clears_an_opt_in_hook_point_switched_off(tiny_model, tiny_tokens):
    tiny_model.set_use_attn_result(True)
    tiny_model.add_hook("blocks.0.attn.hook_result", lambda t, hook: torch.zeros_like(t))
    tiny_model.set_use_attn_result(False)
    tiny_model.reset_hooks()
    assert_no_hooks_attached(tiny_model)
    # Switching the flag back on must not revive the old (non-permanent) hook.
    clean = tiny_model(tiny_tokens)
    tiny_model.set_use_attn_result(True)
    torch.testing.assert_close(tiny_model(tiny_tokens), clean, atol=1e-6, rtol=1e-6)


def test_remove_handles_removes_only_those_hooks(tiny_model, tiny_tokens):
    keep = tiny_model.add_hook("hook_embed", lambda t, hook: None)
    drop = tiny_model.add_hook(lambda n: n.endswith("hook_scale"), lambda t, hook: None)
    assert len(drop) == 5  # ln1, ln2 of two layers and ln_final
    tiny_model.remove_handles(drop)
    attached = [hp.name for hp in all_hook_points(tiny_model) if hp.fwd_hooks]
    assert attached == ["hook_embed"] and keep[0][0].name == "hook_embed"
    tiny_model.reset_hooks()


# ----------------------------------------------------------------------------
# run_with_cache filters
# ----------------------------------------------------------------------------
def test_names_filter_as_a_string_caches_only_that_hook(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter="blocks.1.attn.hook_pattern")
    assert list(cache) == ["blocks.1.attn.hook_pattern"]


def test_names_filter_as_a_list_caches_exactly_those_hooks(tiny_model, tiny_tokens):
    names = ["blocks.1.hook_resid_post", "hook_embed", "blocks.0.mlp.hook_post"]
    _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=names)
    assert set(cache) == set(names)


def test_names_filter_as_a_callable_caches_the_matching_hooks(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: n.endswith("hook_resid_pre"))
    assert list(cache) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]


def test_filtered_cache_holds_the_same_values_as_the_full_one(tiny_model, tiny_tokens):
    _, full = tiny_model.run_with_cache(tiny_tokens)
    _, some = tiny_model.run_with_cache(tiny_tokens, names_filter=["blocks.1.attn.hook_z"])
    # The filtered run takes the fused attention path (nobody asks for the pattern): float error only.
    torch.testing.assert_close(some["z", 1], full["z", 1], atol=1e-6, rtol=1e-5)


def test_names_filter_matching_nothing_is_a_value_error(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match="names_filter"):
        tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: n.startswith("nope"))
    with pytest.raises(ValueError, match="names_filter"):
        tiny_model.run_with_cache(tiny_tokens, names_filter=[])


def test_names_filter_with_unknown_name_is_a_key_error(tiny_model, tiny_tokens):
    with pytest.raises(KeyError, match="hook_resid_post"):
        tiny_model.run_with_cache(tiny_tokens, names_filter=["hook_embed", "blocks.0.hook_resid_postt"])
    assert_no_hooks_attached(tiny_model)


def test_cache_is_detached(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    assert not any(t.requires_grad for t in cache.values())


# ----------------------------------------------------------------------------
# Backward hooks
# ----------------------------------------------------------------------------
def _grad_of_loss_wrt(model: GPT, tokens: torch.Tensor, name: str) -> torch.Tensor:
    """d loss / d activation, by torch.autograd.grad on the activation a forward hook kept."""
    kept = {}
    loss = model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(name, lambda t, hook: kept.setdefault("t", t))])
    return torch.autograd.grad(loss, kept["t"])[0]


def test_backward_hook_receives_gradient_of_loss_wrt_the_activation(tiny_model, tiny_tokens):
    name = "blocks.0.hook_resid_post"
    want = _grad_of_loss_wrt(tiny_model, tiny_tokens, name)
    got = []
    with tiny_model.hooks(bwd_hooks=[(name, lambda g, hook: got.append((hook.name, g.clone())))]):
        tiny_model(tiny_tokens, return_type="loss").backward()
    assert [n for n, _ in got] == [name]
    assert got[0][1].shape == (2, 7, 64)
    torch.testing.assert_close(got[0][1], want)


def test_backward_hook_returning_a_tensor_replaces_the_gradient(tiny_model, tiny_tokens):
    # Zeroing the gradient at resid_pre of layer 1 must cut every gradient to layer 0's weights.
    with tiny_model.hooks(bwd_hooks=[("blocks.1.hook_resid_pre", lambda g, hook: torch.zeros_like(g))]):
        tiny_model(tiny_tokens, return_type="loss").backward()
    assert tiny_model.blocks[0].mlp.W_in.grad.abs().max() == 0
    assert tiny_model.blocks[1].mlp.W_in.grad.abs().max() > 0


def test_run_with_hooks_keeps_backward_hooks_with_reset_hooks_end_false(tiny_model, tiny_tokens):
    name = "blocks.1.hook_attn_out"
    got = []
    loss = tiny_model.run_with_hooks(
        tiny_tokens,
        return_type="loss",
        reset_hooks_end=False,
        bwd_hooks=[(name, lambda g, hook: got.append(g.clone()))],
    )
    loss.backward()
    tiny_model.reset_hooks()
    assert len(got) == 1
    torch.testing.assert_close(got[0], _grad_of_loss_wrt(tiny_model, tiny_tokens, name))
    assert_no_hooks_attached(tiny_model)


def test_run_with_cache_incl_bwd_stores_gradients(tiny_model, tiny_tokens):
    loss, cache = tiny_model.run_with_cache(tiny_tokens, return_type="loss", incl_bwd=True)
    assert loss.ndim == 0
    assert "blocks.0.hook_resid_post_grad" in cache and "blocks.1.attn.hook_pattern_grad" in cache
    forward = {k for k in cache if not k.endswith("_grad")}
    grads = {k.removesuffix("_grad") for k in cache if k.endswith("_grad")}
    assert forward == set(tiny_model.hook_dict) and grads <= forward
    for k in grads:
        assert cache[k + "_grad"].shape == cache[k].shape, k
    want = _grad_of_loss_wrt(tiny_model, tiny_tokens, "blocks.0.hook_resid_post")
    torch.testing.assert_close(cache["blocks.0.hook_resid_post_grad"], want)
    torch.testing.assert_close(
        cache["blocks.1.hook_mlp_out_grad"], _grad_of_loss_wrt(tiny_model, tiny_tokens, "blocks.1.hook_mlp_out")
    )


def test_incl_bwd_without_a_scalar_output_is_a_value_error(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match="return_type='loss'"):
        tiny_model.run_with_cache(tiny_tokens, incl_bwd=True)
    assert_no_hooks_attached(tiny_model)


# ----------------------------------------------------------------------------
# ActivationCache indexing and get_act_name
# ----------------------------------------------------------------------------
def test_cache_short_keys_resolve_to_full_names(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["scale", 1, "ln1"] is cache["blocks.1.ln1.hook_scale"]
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    assert cache["resid_pre", -2] is cache["blocks.0.hook_resid_pre"]
    assert ("pattern", 1) in cache and ("pattern", 5) not in cache and "nope" not in cache


def test_cache_string_short_names_resolve_as_in_transformer_lens(tiny_model, tiny_tokens):
    # transformer-lens' ActivationCache.__getitem__ passes an unknown str key through
    # get_act_name, so cache["embed"], cache["scale"] and cache["pre1"] work there.
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    assert cache["embed"] is cache["hook_embed"]
    assert cache["scale"] is cache["ln_final.hook_scale"]
    assert cache["pre1"] is cache["blocks.1.mlp.hook_pre"]


def test_cache_layer_out_of_range_says_which_layers_exist(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    with pytest.raises(KeyError, match=r"layers are 0\.\.1"):
        cache["resid_post", 2]
    with pytest.raises(KeyError, match=r"layers are 0\.\.1"):
        cache["resid_post", -3]


def test_cache_missing_name_lists_what_is_stored(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=["blocks.0.hook_resid_pre", "hook_embed"])
    with pytest.raises(KeyError, match=r"blocks\.0\.attn\.hook_pattern.*hook_embed.*blocks\.0\.hook_resid_pre"):
        cache["pattern", 0]


@pytest.mark.parametrize(
    "args, want",
    [
        (("k", 6), "blocks.6.attn.hook_k"),
        (("scale", 2, "ln1"), "blocks.2.ln1.hook_scale"),
        (("pre5",), "blocks.5.mlp.hook_pre"),
        (("scale",), "ln_final.hook_scale"),
        (("resid_pre", 0), "blocks.0.hook_resid_pre"),
        (("mlp_out", 3), "blocks.3.hook_mlp_out"),
        (("attn_out", 1), "blocks.1.hook_attn_out"),
        (("embed",), "hook_embed"),
        (("pattern", 4), "blocks.4.attn.hook_pattern"),
        (("attn", 4), "blocks.4.attn.hook_pattern"),
        (("post", 2), "blocks.2.mlp.hook_post"),
        (("normalized", 3, "ln2"), "blocks.3.ln2.hook_normalized"),
        (("resid_post", 11), "blocks.11.hook_resid_post"),
        (("pos_embed",), "hook_pos_embed"),
    ],
)
def test_get_act_name_matches_transformer_lens_spelling(args, want):
    assert get_act_name(*args) == want


def test_get_act_name_agrees_with_transformer_lens():
    tl_utils = pytest.importorskip("transformer_lens.utils")
    cases = [
        ("k", 6),
        ("scale", 2, "ln1"),
        ("pre5",),
        ("scale",),
        ("resid_pre", 0),
        ("mlp_out", 3),
        ("attn_out", 1),
        ("embed",),
        ("z", 0),
        ("q", 1),
        ("v", 2),
        ("attn_scores", 1),
        ("result", 3),
        ("resid_mid", 4),
        ("normalized",),
        ("normalized", 1, "ln2"),
        ("post", 7),
        ("pattern", 2),
        ("k6a",),
        ("scale4ln1",),
        ("attn", 3),
        ("attn_logits", 2),
        ("value", 1),
        ("q_input", 1),
        ("k_input", 0),
        ("v_input", 2),
        ("attn_in", 1),
        ("mlp_in", 3),
        ("tokens",),
    ]
    for args in cases:
        assert get_act_name(*args) == tl_utils.get_act_name(*args), args


def test_every_short_name_is_a_real_hook_point_and_every_hook_point_has_one(tiny_cfg) -> None:
    """With every opt-in hook on, get_act_name's names are exactly the model's hook points
    (q_input & co. are hooks of the block: blocks.L.hook_q_input, not blocks.L.attn.hook_q_input)."""
    for flag in ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in", "use_hook_tokens"):
        setattr(tiny_cfg, flag, True)
    model = GPT(tiny_cfg)
    per_layer = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "v", "z", "pattern"]
    per_layer += ["attn_scores", "result", "pre", "post", "q_input", "k_input", "v_input", "attn_in", "mlp_in"]
    names = {get_act_name(n) for n in ("embed", "pos_embed", "tokens", "scale", "normalized")}
    names.update({"unembed.hook_in", "unembed.hook_out"})  # no short names for these, in transformer-lens either
    for layer in range(tiny_cfg.n_layers):
        names.update(get_act_name(n, layer) for n in per_layer)
        names.update(get_act_name(n, layer, ln) for n in ("scale", "normalized") for ln in ("ln1", "ln2"))
    assert names == set(model.hook_dict), names ^ set(model.hook_dict)
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    assert cache["q_input", 1].shape == (1, 3, tiny_cfg.n_heads, tiny_cfg.d_model)


# ----------------------------------------------------------------------------
# run_with_cache storage options
# ----------------------------------------------------------------------------
def test_run_with_cache_dtype_and_device_are_applied(tiny_model, tiny_tokens):
    _, ref = tiny_model.run_with_cache(tiny_tokens)
    _, cache = tiny_model.run_with_cache(tiny_tokens, device="cpu", dtype=torch.float64)
    assert {t.dtype for t in cache.values()} == {torch.float64}
    assert {t.device.type for t in cache.values()} == {"cpu"}
    torch.testing.assert_close(cache["z", 1], ref["z", 1].double())


def test_run_with_cache_remove_batch_dim_drops_the_batch_axis(tiny_model, tiny_tokens):
    one = tiny_tokens[:1]
    _, with_batch = tiny_model.run_with_cache(one)
    _, cache = tiny_model.run_with_cache(one, remove_batch_dim=True)
    assert set(cache) == set(with_batch)
    for name in with_batch:
        assert cache[name].shape == with_batch[name].shape[1:], name
        torch.testing.assert_close(cache[name], with_batch[name][0])
    assert cache["pattern", 0].shape == (4, 7, 7)


def test_cache_remove_batch_dim_method_needs_batch_of_one(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    with pytest.raises(ValueError, match="batch size 2"):
        cache.remove_batch_dim()
    _, cache = tiny_model.run_with_cache(tiny_tokens[:1])
    assert cache.remove_batch_dim()["resid_pre", 0].shape == (7, 64)


def test_run_with_cache_without_logits_stops_after_the_last_cached_layer(tiny_cfg, tiny_tokens):
    """Caching an early layer with return_type=None runs only the blocks up to it."""
    from interp_gpt import GPT

    cfg = tiny_cfg
    cfg.n_layers = 4
    model = GPT(cfg)
    model.init_weights(seed=0)
    calls: list[int] = []
    handles = [b.register_forward_hook(lambda m, i, o: calls.append(m.layer)) for b in model.blocks]
    try:
        out, cache = model.run_with_cache(tiny_tokens, names_filter="blocks.1.attn.hook_pattern", return_type=None)
        assert out is None and calls == [0, 1]
        calls.clear()
        _, full = model.run_with_cache(tiny_tokens, names_filter="blocks.1.attn.hook_pattern")
        assert calls == [0, 1, 2, 3]  # logits asked for: every block runs
        torch.testing.assert_close(cache["pattern", 1], full["pattern", 1], rtol=0, atol=0)
        calls.clear()
        model.run_with_cache(tiny_tokens, names_filter="ln_final.hook_scale", return_type=None)
        assert calls == [0, 1, 2, 3]  # a hook after the last block needs them all
    finally:
        for h in handles:
            h.remove()


def test_hook_layer_and_add_perma_hook_as_in_transformer_lens(tiny_model: GPT, tiny_tokens) -> None:
    seen: list[int] = []

    def record(x, hook):  # type: ignore[no-untyped-def]
        seen.append(hook.layer())

    tiny_model.add_perma_hook(lambda n: n.endswith("attn.hook_z"), record)
    try:
        tiny_model.reset_hooks()  # permanent: stays
        tiny_model(tiny_tokens)
        assert seen == [0, 1]
    finally:
        tiny_model.reset_hooks(including_permanent=True)
    with pytest.raises(ValueError, match=r"'hook_embed' belongs to no layer"):
        tiny_model.hook_dict["hook_embed"].layer()


def test_prepend_ctx_and_clear_contexts_as_in_transformer_lens(tiny_model: GPT, tiny_tokens) -> None:
    order: list[str] = []

    def first(x, hook):  # type: ignore[no-untyped-def]
        order.append("first")
        hook.ctx["calls"] = hook.ctx.get("calls", 0) + 1

    def second(x, hook):  # type: ignore[no-untyped-def]
        order.append("second")

    tiny_model.add_hook("hook_embed", second)
    tiny_model.add_hook("hook_embed", first, prepend=True)
    tiny_model(tiny_tokens)
    tiny_model(tiny_tokens)
    point = tiny_model.hook_dict["hook_embed"]
    assert order == ["first", "second"] * 2 and point.ctx == {"calls": 2}
    tiny_model.reset_hooks(clear_contexts=False)
    assert point.ctx == {"calls": 2} and not point.fwd_hooks
    tiny_model.reset_hooks()
    assert point.ctx == {}


# ----------------------------------------------------------------------------
# A hooked module of one's own, and which path a forward takes (issue 28)
# ----------------------------------------------------------------------------
def test_a_hooked_root_module_of_ones_own_caches_and_patches():
    """transformer-lens' Main Demo: a module with hook points, setup(), run_with_cache and run_with_hooks."""
    from torch import nn

    from interp_gpt import HookedRootModule

    class SquareThenAdd(nn.Module):
        def __init__(self, offset):
            super().__init__()
            self.offset = nn.Parameter(torch.tensor(offset))
            self.hook_square = HookPoint()

        def forward(self, x):
            return self.offset + self.hook_square(x * x)

    class TwoLayerModel(HookedRootModule):
        def __init__(self):
            super().__init__()
            self.layer1, self.layer2 = SquareThenAdd(3.0), SquareThenAdd(-4.0)
            self.hook_in, self.hook_mid, self.hook_out = HookPoint(), HookPoint(), HookPoint()
            self.setup()

        def forward(self, x):
            return self.hook_out(self.layer2(self.hook_mid(self.layer1(self.hook_in(x)))))

    model = TwoLayerModel()
    out, cache = model.run_with_cache(torch.tensor(5.0))
    assert out.item() == 780.0
    assert [(k, cache[k].item()) for k in cache] == [
        ("hook_in", 5.0), ("layer1.hook_square", 25.0), ("hook_mid", 28.0), ("layer2.hook_square", 784.0), ("hook_out", 780.0)
    ]  # fmt: skip
    patched = model.run_with_hooks(
        torch.tensor(5.0), fwd_hooks=[("layer2.hook_square", lambda t, hook: torch.tensor(0.0))]
    )
    assert patched.item() == -4.0 and len(list(model.hook_points())) == 5
    assert model.hook_dict["layer1.hook_square"].name == "layer1.hook_square"


def test_only_a_cache_takes_the_explicit_paths_everywhere(tiny_model, tiny_tokens, monkeypatch):
    """The fused attention runs in a forward with no hook and where no hook watches the pattern; inside
    run_with_cache every layer computes its pattern (explicit_paths), whatever the names_filter."""
    import torch.nn.functional as F

    from interp_gpt.hooks import explicit_paths

    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    tiny_model(tiny_tokens)
    assert len(calls) == tiny_model.cfg.n_layers  # no hook: fused everywhere
    tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: None)])
    assert len(calls) == 2 * tiny_model.cfg.n_layers - 1  # a hooked pattern takes its layer off the fused kernel
    tiny_model.run_with_cache(tiny_tokens, names_filter="hook_embed")
    assert len(calls) == 2 * tiny_model.cfg.n_layers - 1  # a cache: no fused attention at all
    assert not explicit_paths()  # and the mode ends with the cache
