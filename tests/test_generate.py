"""Generation with and without the key/value cache, sampling controls, hooks during generation."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.model import KVCache
from interp_gpt.tokenizer import gpt2_tokenizer


def _model(n_ctx: int = 64, seed: int = 0) -> GPT:
    model = GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=n_ctx))
    model.init_weights(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # biases and LN weights off their (0, 1) init so every term matters
        for name, p in model.named_parameters():
            if not name.split(".")[-1].startswith("W_"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        model.unembed.W_U.mul_(20)  # peaked distributions: greedy choices are far from ties
    return model.eval()


def _prompt(batch: int = 1, posn: int = 5) -> torch.Tensor:
    return torch.randint(0, 99, (batch, posn), generator=torch.Generator().manual_seed(7))


def test_incremental_forward_with_kv_cache_equals_full_forward():
    model, tokens = _model(), _prompt(2, 12)
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(model.cfg.n_layers)
        first = model(tokens[:, :5], past_kv_cache=cache)
        steps = [model(tokens[:, i : i + 1], past_kv_cache=cache) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.length == 12 and cache.keys[1].shape == (2, 12, 4, 16)


def test_greedy_generation_is_the_same_with_and_without_kv_cache():
    model, prompt = _model(), _prompt(2, 5)
    a = model.generate(prompt, max_new_tokens=20, do_sample=False, stop_at_eos=False, use_past_kv_cache=True)
    b = model.generate(prompt, max_new_tokens=20, do_sample=False, stop_at_eos=False, use_past_kv_cache=False)
    assert a.shape == (2, 25)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :5], prompt)


def test_greedy_generation_takes_the_argmax_of_a_full_forward_each_step():
    model, prompt = _model(), _prompt(1, 4)
    out = model.generate(prompt, max_new_tokens=6, do_sample=False, stop_at_eos=False)
    with torch.no_grad():
        for i in range(4, 10):
            assert out[0, i] == model(out[:, :i])[0, -1].argmax()


def test_sampling_is_reproducible_with_a_seed_and_top_k_1_is_greedy():
    model, prompt = _model(), _prompt(3, 4)
    kw = dict(max_new_tokens=12, stop_at_eos=False, temperature=5.0)
    s1 = model.generate(prompt, seed=123, **kw)
    s2 = model.generate(prompt, seed=123, **kw)
    s3 = model.generate(prompt, seed=124, **kw)
    assert torch.equal(s1, s2) and not torch.equal(s1, s3)
    greedy = model.generate(prompt, do_sample=False, **kw)
    assert torch.equal(model.generate(prompt, seed=5, top_k=1, **kw), greedy)
    assert torch.equal(model.generate(prompt, seed=5, top_p=1e-6, **kw), greedy)  # only the top token survives


def test_top_k_restricts_samples_to_the_k_most_likely_tokens():
    model = _model()
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    allowed = logits.topk(3, dim=-1).indices
    for _ in range(50):
        tok = model._sample(logits, True, 10.0, 3, None, gen)
        assert all(t in row for t, row in zip(tok.tolist(), allowed.tolist(), strict=True))


def test_hooks_fire_at_every_generation_step():
    model, prompt = _model(), _prompt(1, 5)
    seen: list[tuple[int, ...]] = []
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_post", lambda t, hook: seen.append(tuple(t.shape)))]):
        model.generate(prompt, max_new_tokens=4, do_sample=False, stop_at_eos=False)
    # the prompt once, then one new position per step (the cache holds the rest)
    assert seen == [(1, 5, 64), (1, 1, 64), (1, 1, 64), (1, 1, 64)]
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_generation_stops_at_eos():
    model = _model()
    with torch.no_grad():
        model.unembed.b_U[42] = 1e4  # token 42 always wins
    out = model.generate(_prompt(1, 3), max_new_tokens=10, do_sample=False, eos_token_id=42)
    assert out.tolist()[0][3:] == [42]


def test_batched_string_prompts_generate_what_each_prompt_generates_alone(gpt2_vocab_dir):
    cfg = Config(n_layers=2, d_model=64, n_heads=4, d_vocab=50257, n_ctx=64)
    model = GPT(cfg, tokenizer=gpt2_tokenizer(gpt2_vocab_dir))
    model.init_weights(0)
    model.eval()
    prompts = ["Hello world, this is a longer prompt", "Hi"]
    together = model.generate(prompts, max_new_tokens=6, do_sample=False, stop_at_eos=False)
    alone = [model.generate(p, max_new_tokens=6, do_sample=False, stop_at_eos=False) for p in prompts]
    assert together == alone
    # The prepended BOS is left out of the text, as transformer-lens decodes (skip_special_tokens).
    assert all(isinstance(t, str) and t.startswith(p) for t, p in zip(alone, prompts, strict=True))
    assert not any("<|endoftext|>" in t for t in alone)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(max_new_tokens=60), "longer than the context of 64"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=0.0), "temperature"),
    ],
)
def test_bad_generation_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _model().generate(_prompt(1, 5), **{"stop_at_eos": False, **kwargs})


def test_empty_prompt_and_missing_eos_are_clear_errors():
    model = _model()
    with pytest.raises(ValueError, match="empty sequence"):
        model.generate(torch.zeros((1, 0), dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="eos_token_id"):
        model.generate(_prompt(1, 3), max_new_tokens=2)  # no tokenizer, stop_at_eos=True by default
