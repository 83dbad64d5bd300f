"""The explicit attention in blocks of queries (interp_gpt/attention_blocks.py) against the whole
products: the same cache, the same logits, and a hook that edits the scores or the pattern gets the
whole product (the skipped parts are used only while nobody changed them).

Blocks are made small (BLOCK = 8 on 30 tokens: 4 blocks, the last one short) so the tiny model runs
the path; BLOCK = a huge number gives the whole products, the reference.
"""

from __future__ import annotations

import pytest
import torch

import interp_gpt.model.attention_blocks as blocks

N = 30


@pytest.fixture
def tokens(tiny_cfg):
    return torch.randint(0, tiny_cfg.d_vocab, (2, N), generator=torch.Generator().manual_seed(3))


def run_both(monkeypatch, fn):
    """fn() with blocks of 8 and with the whole products; counts the blocked calls."""
    calls = []
    real = blocks.causal_attention_in_blocks

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("interp_gpt.model.gpt.causal_attention_in_blocks", counting)
    monkeypatch.setattr(blocks, "BLOCK", 8)
    got = fn()
    n_blocked = len(calls)
    monkeypatch.setattr(blocks, "BLOCK", 10**9)
    want = fn()
    assert len(calls) == n_blocked, "the whole products took the blocked path"
    return got, want, n_blocked


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_cache_matches_the_whole_products(tiny_model, tokens, monkeypatch, mode):
    ctx = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with ctx():
        (logits, cache), (ref_logits, ref), n = run_both(monkeypatch, lambda: tiny_model.run_with_cache(tokens))
        plain = tiny_model(tokens)  # the fused kernel
    assert n == tiny_model.cfg.n_layers
    for layer in range(tiny_model.cfg.n_layers):
        scores, pattern = cache["attn_scores", layer], cache["pattern", layer]
        masked = torch.ones(N, N, dtype=torch.bool).triu(1)
        assert torch.equal(scores[..., masked], torch.full_like(scores[..., masked], -torch.inf))
        assert torch.equal(pattern[..., masked], torch.zeros_like(pattern[..., masked]))
        torch.testing.assert_close(scores[..., ~masked], ref["attn_scores", layer][..., ~masked], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pattern, ref["pattern", layer], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cache["z", layer], ref["z", layer], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, plain, atol=1e-4, rtol=1e-4)


def unmask_in_place(scores, hook):
    scores[..., 0, 20] = 0.0  # query 0 may now see key 20: outside what the blocks compute


def unmask_returned(scores, hook):
    return torch.where(torch.ones_like(scores, dtype=torch.bool).triu(1), 0.0, scores)


def future_pattern_in_place(pattern, hook):
    pattern[..., 3, 20] = 0.5  # weight on a later key: outside what the blocks multiply


def future_pattern_returned(pattern, hook):
    return pattern + 0.01


@pytest.mark.parametrize(
    "name, hook",
    [
        ("attn_scores", unmask_in_place),
        ("attn_scores", unmask_returned),
        ("pattern", future_pattern_in_place),
        ("pattern", future_pattern_returned),
    ],
)
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_a_hook_that_edits_gets_the_whole_product(tiny_model, tokens, monkeypatch, name, hook, mode):
    ctx = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    hooks = [(f"blocks.1.attn.hook_{name}", hook)]
    with ctx():
        got, want, n = run_both(monkeypatch, lambda: tiny_model.run_with_hooks(tokens, fwd_hooks=hooks))
        untouched = tiny_model(tokens)
    assert n == 1  # layer 1 only: layer 0 has no hook and takes the fused kernel
    assert (want - untouched).abs().max() > 1e-3, "the edit should change the logits"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_autograd_takes_the_whole_products(tiny_model, tokens, monkeypatch):
    # Gradients need the ops autograd can follow, so the blocks (written into buffers) stand aside.
    def loss():
        tiny_model.zero_grad()
        _, cache = tiny_model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
        out = tiny_model.run_with_hooks(
            tokens, return_type="loss", fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: p)]
        )
        out.backward()
        return tiny_model.blocks[0].attn.W_Q.grad.clone()

    got, want, n = run_both(monkeypatch, loss)
    assert n == 0
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_value_hook_with_a_graph_takes_the_whole_products(tiny_model, tokens, monkeypatch):
    # Under no_grad nothing records a graph; with grad on and only v carrying one, the blocks must stand aside
    # (their matmul(out=...) writes cannot be differentiated).
    tiny_model.requires_grad_(False)
    extra = torch.zeros(tiny_model.cfg.n_heads, tiny_model.cfg.d_head, requires_grad=True)
    hooks = [("blocks.0.attn.hook_v", lambda v, hook: v + extra), ("blocks.0.attn.hook_pattern", lambda p, hook: None)]

    def grad():
        extra.grad = None
        tiny_model.run_with_hooks(tokens, fwd_hooks=hooks, return_type="loss").backward()
        return extra.grad.clone()

    got, want, n = run_both(monkeypatch, grad)
    assert n == 0
    torch.testing.assert_close(got, want, atol=0, rtol=0)
