"""Steering (interp_gpt.steering): steer in forward passes and in generate with the key/value cache,
against a loop of full forwards and against Hugging Face's cached generation; hooks always removed;
contrastive vectors over prompts of unequal length; SAE directions; map_direction raw <-> processed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import make_hf_gpt2  # noqa: E402

from interp_gpt import GPT  # noqa: E402
from interp_gpt.sae import SAE, SAEConfig  # noqa: E402
from interp_gpt.steering import Steering, contrastive_vector, map_direction, sae_direction, steer  # noqa: E402

HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def hf_peaked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A random HF GPT-2 whose logits are peaked (ln_f scaled up: greedy choices far from ties), and its folder."""
    hf = make_hf_gpt2(seed=3)
    with torch.no_grad():
        hf.transformer.ln_f.weight.mul_(20)
    folder = tmp_path_factory.mktemp("hf_peaked")
    hf.save_pretrained(folder)
    return hf, folder


@pytest.fixture(scope="module")
def raw(hf_peaked: tuple[Any, Path]) -> GPT:
    return GPT.from_pretrained_no_processing(str(hf_peaked[1])).eval()


@pytest.fixture(scope="module")
def processed(hf_peaked: tuple[Any, Path]) -> GPT:
    return GPT.from_pretrained(str(hf_peaked[1])).eval()


def _prompt(n: int = 5, seed: int = 7) -> torch.Tensor:
    return torch.randint(1, 100, (1, n), generator=torch.Generator().manual_seed(seed))


def _vector(d: int = 64, scale: float = 3.0, seed: int = 0) -> torch.Tensor:
    return scale * torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _reference(model: GPT, tokens: torch.Tensor, n: int, fwd: list[tuple[str, Any]]) -> torch.Tensor:
    """Greedy decoding by a loop of full forwards with plain hooks."""
    out = tokens
    with torch.no_grad(), model.hooks(fwd_hooks=fwd):
        for _ in range(n):
            out = torch.cat([out, model(out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


def _generate(model: GPT, tokens: torch.Tensor, n: int, cache: bool = True) -> torch.Tensor:
    return model.generate(tokens, max_new_tokens=n, do_sample=False, stop_at_eos=False, use_past_kv_cache=cache)


def test_steered_cached_generation_equals_full_forward_loop_and_hugging_face(
    raw: GPT, hf_peaked: tuple[Any, Path]
) -> None:
    hf, _ = hf_peaked
    tokens, v, n = _prompt(), _vector(), 10
    with steer(raw, HOOK, v, coeff=2.0):
        ours = _generate(raw, tokens, n)
    reference = _reference(raw, tokens, n, [(HOOK, lambda x, hook: x + 2.0 * v)])
    assert torch.equal(ours, reference)
    assert not torch.equal(ours, _generate(raw, tokens, n))  # the steering changes what is generated

    def add(module: Any, args: Any, output: Any) -> Any:  # HF's block 0 returns resid_post (or a tuple with it)
        if isinstance(output, tuple):
            return (output[0] + 2.0 * v, *output[1:])
        return output + 2.0 * v

    handle = hf.transformer.h[0].register_forward_hook(add)
    try:
        with torch.no_grad():
            theirs = hf.generate(
                tokens,
                attention_mask=torch.ones_like(tokens),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
    finally:
        handle.remove()
    assert torch.equal(ours, theirs)


def test_positions_mean_the_same_tokens_with_and_without_the_cache(raw: GPT) -> None:
    tokens, v, n = _prompt(6), _vector(seed=1), 8
    plain = _generate(raw, tokens, n)
    for positions, columns in ((slice(6, None), set(range(6, 20))), ([2, 8, 9], {2, 8, 9}), (5, {5})):

        def add_at(x: torch.Tensor, hook: Any, columns: set[int] = columns) -> torch.Tensor:
            keep = torch.tensor([p in columns for p in range(x.shape[1])])
            return x + 6.0 * v * keep[None, :, None]

        with steer(raw, HOOK, v, coeff=6.0, positions=positions):
            cached, full = _generate(raw, tokens, n), _generate(raw, tokens, n, cache=False)
        reference = _reference(raw, tokens, n, [(HOOK, add_at)])
        assert torch.equal(cached, reference) and torch.equal(full, reference), positions
        assert not torch.equal(reference, plain), positions  # each steering changes what is generated


def test_hooks_are_removed_on_exit_and_on_an_error(raw: GPT) -> None:
    tokens = _prompt()
    plain = raw(tokens)
    with steer(raw, HOOK, _vector(), positions=[1]):
        assert raw.hook_dict[HOOK].fwd_hooks and raw._forward_pre_hooks
        assert not torch.allclose(raw(tokens), plain)
    assert not raw.hook_dict[HOOK].fwd_hooks and not raw._forward_pre_hooks
    with pytest.raises(RuntimeError, match="boom"), steer(raw, HOOK, _vector(), positions=[1]):
        raise RuntimeError("boom")
    assert not raw.hook_dict[HOOK].fwd_hooks and not raw._forward_pre_hooks
    torch.testing.assert_close(raw(tokens), plain, atol=0, rtol=0)


def test_steering_fires_only_in_the_thread_that_entered_it(raw: GPT) -> None:
    import threading

    tokens = _prompt()
    plain, seen = raw(tokens), {}
    with steer(raw, HOOK, _vector(), positions=slice(0, None)):
        worker = threading.Thread(target=lambda: seen.update(other=raw(tokens)))
        worker.start()
        worker.join()
        mine = raw(tokens)
    torch.testing.assert_close(seen["other"], plain, atol=0, rtol=0)
    assert not torch.allclose(mine, plain, atol=1e-3)


def test_several_at_once_compose_nested_or_as_a_list(raw: GPT) -> None:
    tokens, v, w = _prompt(), _vector(seed=1), _vector(seed=2)
    other = "blocks.1.hook_resid_pre"
    with steer(raw, HOOK, v), steer(raw, other, w, coeff=-1.5), steer(raw, HOOK, w):
        nested = raw(tokens)
    with steer(raw, [Steering(HOOK, v), Steering(other, w, coeff=-1.5), Steering(HOOK, w)]):
        listed = raw(tokens)
    manual = raw.run_with_hooks(
        tokens, fwd_hooks=[(HOOK, lambda x, hook: x + v + w), (other, lambda x, hook: x - 1.5 * w)]
    )
    torch.testing.assert_close(nested, manual, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(listed, manual, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(manual, raw(tokens), atol=1e-3)


def test_project_out_leaves_no_component_and_ablate_sets_it(raw: GPT) -> None:
    tokens = _prompt(7)
    for hook, v in ((HOOK, _vector()), ("blocks.1.attn.hook_z", torch.randn(4, 16))):
        u = (v / v.norm()).flatten()
        _, before = raw.run_with_cache(tokens, names_filter=hook)
        assert before[hook].flatten(2).matmul(u).abs().min() > 1e-3  # there was something to remove
        with steer(raw, hook, v, mode="project_out"):
            _, cache = raw.run_with_cache(tokens, names_filter=hook)
        along = cache[hook].flatten(2) @ u
        assert along.abs().max() < 1e-5
        # only the component along u changed
        rest = before[hook].flatten(2) - (before[hook].flatten(2) @ u)[..., None] * u
        torch.testing.assert_close(cache[hook].flatten(2), rest, atol=1e-5, rtol=1e-5)
        with steer(raw, hook, v, mode="ablate", coeff=0.75):
            _, cache = raw.run_with_cache(tokens, names_filter=hook)
        torch.testing.assert_close(cache[hook].flatten(2) @ u, torch.full_like(along, 0.75), atol=1e-5, rtol=1e-5)
        with steer(raw, hook, v, mode="project_out", coeff=0.5):  # half of it removed
            _, cache = raw.run_with_cache(tokens, names_filter=hook)
        torch.testing.assert_close(
            cache[hook].flatten(2) @ u, 0.5 * (before[hook].flatten(2) @ u), atol=1e-5, rtol=1e-5
        )


def test_contrastive_vector_reads_each_prompts_last_real_token() -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    hook = "blocks.1.hook_resid_pre"
    pos, neg = ["I love it", "A wonderful, wonderful day at the sea", "Good"], ["I hate it", "Awful"]

    def alone(prompts: list[str], position: int) -> torch.Tensor:
        acts = [model.run_with_cache(p, names_filter=hook)[1][hook][0, position] for p in prompts]
        return torch.stack(acts).mean(0)

    for position in (-1, 1, -2):
        want = alone(pos, position) - alone(neg, position)
        for batch_size in (1, 32):
            got = contrastive_vector(model, pos, neg, hook, position=position, batch_size=batch_size)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"position=4 is outside pos_prompts\[0\] \('I love it', 4 tokens\)"):
        contrastive_vector(model, pos, neg, hook, position=4)


def _sae(model: GPT, hook: str, d_in: int, **cfg: Any) -> SAE:
    sae = SAE(SAEConfig(d_in=d_in, d_sae=32, metadata={"hook_name": hook}, **cfg))
    sae.init_weights(seed=0)
    return sae


def test_sae_direction_maps_a_hook_z_feature_through_W_O_exactly(raw: GPT) -> None:
    tokens = _prompt(6)
    z_sae = _sae(raw, "blocks.1.attn.hook_z", 64, reshape_activations="hook_z")
    hook, v = sae_direction(raw, z_sae, 5)
    z_hook, z_v = sae_direction(raw, z_sae, 5, resid=False)
    assert (hook, tuple(v.shape)) == ("blocks.1.hook_attn_out", (64,))
    assert (z_hook, tuple(z_v.shape)) == ("blocks.1.attn.hook_z", (4, 16))
    torch.testing.assert_close(z_v.flatten(), z_sae.W_dec[5].detach())
    with steer(raw, hook, v, coeff=3.0):
        at_out = raw(tokens)
    with steer(raw, z_hook, z_v, coeff=3.0):
        at_z = raw(tokens)
    torch.testing.assert_close(at_out, at_z, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(at_out, raw(tokens), atol=1e-3)
    resid_sae = _sae(raw, "blocks.1.hook_resid_pre", 64)
    hook, v = sae_direction(raw, resid_sae, 7)
    assert hook == "blocks.1.hook_resid_pre" and torch.equal(v, resid_sae.W_dec[7].detach())
    head_sae = _sae(raw, "blocks.1.attn.hook_z", 16)  # one head: hook_head_index
    with pytest.raises(ValueError, match="set sae.cfg.metadata.hook_head_index to its head"):
        sae_direction(raw, head_sae, 0)
    head_sae.cfg.metadata["hook_head_index"] = 2
    hook, v = sae_direction(raw, head_sae, 4)
    z_hook, z_v = sae_direction(raw, head_sae, 4, resid=False)
    assert hook == "blocks.1.hook_attn_out" and z_v[[0, 1, 3]].abs().max() == 0
    torch.testing.assert_close(z_v[2], head_sae.W_dec[4].detach())
    with steer(raw, hook, v, coeff=3.0):
        at_out = raw(tokens)
    with steer(raw, z_hook, z_v, coeff=3.0):
        torch.testing.assert_close(raw(tokens), at_out, atol=1e-5, rtol=1e-5)
    post_sae = _sae(raw, "blocks.0.mlp.hook_post", 256)
    hook, v = sae_direction(raw, post_sae, 2)
    torch.testing.assert_close(v, post_sae.W_dec[2].detach() @ raw.blocks[0].mlp.W_out.detach())
    assert hook == "blocks.0.hook_mlp_out"


def _log_probs(
    model: GPT, tokens: torch.Tensor, hook: str, v: torch.Tensor, mode: str, coeff: float | None
) -> torch.Tensor:
    with steer(model, hook, v, coeff=coeff, mode=mode):  # type: ignore[arg-type]
        return model(tokens).log_softmax(-1)


@pytest.mark.parametrize(
    "hook, mode, coeff, centred, direction",
    [
        ("blocks.1.hook_resid_pre", "add", 2.0, False, "both"),
        ("blocks.1.hook_resid_pre", "project_out", None, True, "both"),
        ("blocks.0.hook_attn_out", "ablate", 1.5, True, "both"),
        ("blocks.1.ln2.hook_normalized", "add", 2.0, False, "processed->raw"),
        ("blocks.1.ln2.hook_normalized", "add", 2.0, True, "raw->processed"),
        ("blocks.0.ln1.hook_normalized", "project_out", None, True, "both"),
        ("unembed.hook_in", "add", 2.0, False, "processed->raw"),
        ("blocks.1.attn.hook_z", "add", 2.0, False, "both"),
        ("blocks.0.mlp.hook_post", "project_out", None, False, "both"),
        ("unembed.hook_out", "add", 2.0, False, "both"),
    ],
)
def test_map_direction_steers_raw_and_processed_weights_alike(
    raw: GPT, processed: GPT, hook: str, mode: str, coeff: float | None, centred: bool, direction: str
) -> None:
    tokens = _prompt(6)
    plain = raw(tokens).log_softmax(-1)
    torch.testing.assert_close(processed(tokens).log_softmax(-1), plain, atol=1e-4, rtol=1e-4)
    shape = {"blocks.1.attn.hook_z": (4, 16), "blocks.0.mlp.hook_post": (256,), "unembed.hook_out": (100,)}.get(
        hook, (64,)
    )
    v = 2.0 * torch.randn(shape, generator=torch.Generator().manual_seed(4)) + 0.5  # a mean, on purpose
    if centred:
        v = v - v.mean(-1, keepdim=True)
    pairs = {"processed->raw": [(processed, raw)], "raw->processed": [(raw, processed)]}.get(
        direction, [(processed, raw), (raw, processed)]
    )
    for a, b in pairs:
        want = _log_probs(a, tokens, hook, v, mode, coeff)
        got = _log_probs(b, tokens, hook, map_direction(v, a, b, hook, mode=mode), mode, coeff)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
        assert not torch.allclose(want, plain, atol=1e-3)  # the steering did something


@pytest.mark.parametrize(
    "hook, mode, shape, match",
    [
        ("blocks.1.ln2.hook_normalized", "add", (64,), "fold_ln centres the weights"),
        ("blocks.1.hook_resid_pre", "project_out", (64,), "differ by their mean"),
        ("blocks.1.attn.hook_z", "project_out", (4, 16), "fold_value_biases moved the constant"),
        ("unembed.hook_in", "project_out", (64,), "x_hat \\* w \\+ b"),
        ("unembed.hook_in", "add", (64,), "must make v / ln_final.w mean-zero"),
    ],
)
def test_map_direction_refuses_what_no_vector_does_exactly(
    raw: GPT, processed: GPT, hook: str, mode: str, shape: tuple[int, ...], match: str
) -> None:
    v = torch.randn(shape, generator=torch.Generator().manual_seed(5)) + 0.5
    with pytest.raises(ValueError, match=match) as info:
        map_direction(v, raw, processed, hook, mode=mode)  # type: ignore[arg-type]
    assert hook in str(info.value)


def test_map_direction_between_partly_processed_models(hf_peaked: tuple[Any, Path], processed: GPT) -> None:
    folded_only = GPT.from_pretrained(str(hf_peaked[1]), center_writing_weights=False, center_unembed=False).eval()
    tokens = _prompt(6)
    for hook, mode, shape in (
        ("unembed.hook_in", "add", (64,)),  # folded on both: the same activation
        ("unembed.hook_in", "project_out", (64,)),
        ("blocks.1.hook_resid_mid", "add", (64,)),
        ("blocks.1.attn.hook_z", "ablate", (4, 16)),  # the value constants agree (fold_value_biases on both)
    ):
        v = torch.randn(shape, generator=torch.Generator().manual_seed(6)) + 0.5
        for a, b in ((processed, folded_only), (folded_only, processed)):
            want = _log_probs(a, tokens, hook, v, mode, 1.0)
            got = _log_probs(b, tokens, hook, map_direction(v, a, b, hook, mode=mode), mode, 1.0)  # type: ignore[arg-type]
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_map_direction_between_alike_models_is_the_identity(raw: GPT, processed: GPT) -> None:
    r = torch.randn(64) + 0.5  # onto centred writers an added direction goes mean-zero (the same effect)
    torch.testing.assert_close(map_direction(r, raw, processed, "blocks.1.hook_resid_pre"), r - r.mean())
    assert torch.equal(map_direction(r, processed, raw, "blocks.1.hook_resid_pre"), r)
    v = torch.randn(4, 16)
    assert torch.equal(map_direction(v, processed, processed, "blocks.0.attn.hook_z", mode="project_out"), v)
    assert torch.equal(map_direction(v, raw, processed, "blocks.0.attn.hook_q", mode="ablate"), v)


@pytest.mark.parametrize(
    "flags", [dict(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True), dict(use_attn_in=True)]
)
def test_every_hook_takes_a_vector_of_its_activations_shape_at_one_position(flags: dict[str, bool]) -> None:
    from interp_gpt import Config

    model = GPT(Config(n_layers=2, d_model=32, n_heads=4, d_vocab=50, n_ctx=16, **flags)).eval()
    tokens = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    steered = 0
    for name, act in cache.items():
        if name.endswith(("hook_pattern", "hook_attn_scores")):
            continue
        site = act.shape[2:]
        with steer(model, name, torch.ones(site), coeff=0.0):  # the shape the config says is the real one
            model(tokens)
        with pytest.raises(ValueError, match="per position"):
            steer(model, name, torch.ones(*site[:-1], site[-1] + 1)).__enter__()
        steered += 1
    assert steered == len(cache) - 2 * model.cfg.n_layers


def test_bad_inputs_are_refused_by_name(raw: GPT) -> None:
    v = _vector()
    with pytest.raises(ValueError, match=r"vector has shape \(63,\).*holds \[64\] per position"):
        steer(raw, HOOK, torch.zeros(63)).__enter__()
    with pytest.raises(ValueError, match=r"shape \(64,\).*'blocks.0.attn.hook_z' holds \[4, 16\]"):
        steer(raw, "blocks.0.attn.hook_z", v).__enter__()
    with pytest.raises(KeyError, match="did you mean 'blocks.0.hook_resid_post'"):
        steer(raw, "blocks.0.hook_resid_pots", v).__enter__()
    with pytest.raises(KeyError, match="layers are 0..1"):
        steer(raw, "blocks.7.hook_resid_post", v).__enter__()
    with pytest.raises(ValueError, match="holds no vector per position"):
        steer(raw, "blocks.0.attn.hook_pattern", v).__enter__()
    with pytest.raises(ValueError, match="positions: -1 is negative"):
        steer(raw, HOOK, v, positions=[-1]).__enter__()
    with pytest.raises(ValueError, match="positions.start=-3 is negative"):
        steer(raw, HOOK, v, positions=slice(-3, None)).__enter__()
    with pytest.raises(ValueError, match="mode='scale'"):
        steer(raw, HOOK, v, mode="scale").__enter__()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vector is zero"):
        steer(raw, HOOK, torch.zeros(64), mode="project_out").__enter__()
    with pytest.raises(TypeError, match="vector must be a tensor, got list"):
        steer(raw, HOOK, [0.0] * 64).__enter__()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-finite"):
        steer(raw, HOOK, torch.full((64,), float("nan"))).__enter__()
    with pytest.raises(ValueError, match="leave vector, coeff, mode and positions out"):
        steer(raw, [Steering(HOOK, v)], v).__enter__()
    with pytest.raises(ValueError, match=r"hook\[1\].vector has shape \(3,\)"):
        steer(raw, [Steering(HOOK, v), Steering(HOOK, torch.ones(3))]).__enter__()
    assert not raw.hook_dict[HOOK].fwd_hooks  # nothing was attached by a refused call
    with pytest.raises(ValueError, match="pos_prompts is empty"):
        contrastive_vector(raw, [], ["x"], HOOK)
    other = GPT.from_pretrained("tiny-gpt2")
    with pytest.raises(ValueError, match="from_model has d_model=64, to_model d_model=128"):
        map_direction(v, raw, other, HOOK)
