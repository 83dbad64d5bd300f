"""interp_gpt.inspect: head scores, logit lens, residual norms, direct logit attribution.

Values are checked against the cache (or against patterns built by hand), and the head
scores against models whose heads are set by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from interp_gpt import GPT, ActivationCache, Config
from interp_gpt import inspect as ins


def one_layer_model(n_heads: int = 2) -> GPT:
    model = GPT(Config(n_layers=1, d_model=16, n_heads=n_heads, d_head=4, d_vocab=20, n_ctx=16))
    model.init_weights(seed=0)
    return model.eval()


def fake_cache(model: GPT, patterns: torch.Tensor) -> ActivationCache:
    """A cache holding only the given patterns [n_layers, batch, head, q, k]."""
    return ActivationCache({f"blocks.{L}.attn.hook_pattern": p for L, p in enumerate(patterns)}, model)


# ----------------------------------------------------------------------------
# head scores: their definitions, on patterns written by hand
# ----------------------------------------------------------------------------
def test_scores_on_hand_written_patterns() -> None:
    n = 6
    previous = torch.diag(torch.ones(n - 1), -1)
    previous[0, 0] = 1.0
    uniform = torch.tril(torch.ones(n, n))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    tokens = torch.tensor([[5, 7, 5, 9, 7, 5]])
    copies = (tokens[0, :, None] == tokens[0, None, :]) & torch.ones(n, n, dtype=torch.bool).tril(-1)
    duplicate = torch.where(copies.any(-1, keepdim=True), copies.float(), torch.eye(n))
    duplicate = duplicate / duplicate.sum(-1, keepdim=True)
    patterns = torch.stack([previous, uniform, duplicate])[None, None]  # [layer, batch, head, q, k]
    cache = fake_cache(one_layer_model(n_heads=3), patterns)

    prev = ins.previous_token_scores(cache)
    assert prev.shape == (1, 3)
    assert prev[0, 0] == pytest.approx(1.0)
    assert prev[0, 1] == pytest.approx(sum(1 / (q + 1) for q in range(1, n)) / (n - 1))

    dup = ins.duplicate_token_scores(cache, tokens)
    assert dup[0, 2] == pytest.approx(1.0)
    # uniform attention: at each query with earlier copies, (number of copies) / (q + 1)
    queries = [q for q in range(n) if copies[q].any()]
    assert dup[0, 1] == pytest.approx(sum(copies[q].sum().item() / (q + 1) for q in queries) / len(queries))

    # induction at "5 7 5 9 7 5": q=2 (5) -> k=1 (7 came after the 5 at 0); q=4 (7) -> k=2;
    # q=5 (5) -> k=1 and k=3 (after the 5s at 0 and 2)
    ind = ins.induction_scores(cache, tokens[0])  # a [pos] tensor works for one prompt
    expected_prev = (previous[2, 1] + previous[4, 2] + previous[5, 1] + previous[5, 3]) / 3
    assert ind[0, 0] == pytest.approx(float(expected_prev))


def test_induction_score_is_the_diagonal_on_repeated_tokens(tiny_model: GPT) -> None:
    """On repeated tokens whose first half has no repeats, the score is the mean of the
    diagonal one repeat back (ARENA / transformer-lens), over the second half."""
    seq_len = 10
    half = torch.randperm(tiny_model.cfg.d_vocab - 1, generator=torch.Generator().manual_seed(0))[:seq_len]
    tokens = torch.cat([torch.tensor([tiny_model.cfg.d_vocab - 1]), half, half])[None]
    _, cache = tiny_model.run_with_cache(tokens)
    scores = ins.induction_scores(cache, tokens)
    for L in range(tiny_model.cfg.n_layers):
        pattern = cache["pattern", L][0]  # [head, q, k]
        second_half = torch.arange(seq_len + 1, 2 * seq_len + 1)
        expected = pattern[:, second_half, second_half - seq_len + 1].mean(-1)
        torch.testing.assert_close(scores[L], expected)


def test_repeated_tokens_as_transformer_lens_draws_them(tiny_model: GPT) -> None:
    tokens = ins.repeated_tokens(tiny_model, seq_len=5, batch_size=3, seed=1)
    assert tokens.shape == (3, 11)
    assert (tokens[:, 0] == tiny_model.cfg.d_vocab - 1).all()  # no tokenizer: the last id is BOS
    assert torch.equal(tokens[:, 1:6], tokens[:, 6:])
    many = ins.repeated_tokens(tiny_model, seq_len=16, batch_size=100, prepend_bos=False)
    assert many.max() == tiny_model.cfg.d_vocab - 2  # never the end-of-text id, as TL never draws 50256
    assert torch.equal(tokens, ins.repeated_tokens(tiny_model, seq_len=5, batch_size=3, seed=1))  # seeded
    no_bos = ins.repeated_tokens(tiny_model, seq_len=5, batch_size=2, prepend_bos=False, low=10, high=20)
    assert no_bos.shape == (2, 10) and ((no_bos >= 10) & (no_bos < 20)).all()


def test_previous_token_head_set_by_hand_scores_highest(tiny_model: GPT) -> None:
    """Layer 1, head 2 made a previous-token head: positions on a circle (W_pos), the query
    rotated back one step (W_Q), so q_i . k_j is largest for j = i - 1."""
    L, H, theta, n_pos = 1, 2, math.pi / 4, 8
    angles = torch.arange(tiny_model.cfg.n_ctx) * theta
    with torch.no_grad():
        tiny_model.pos_embed.W_pos[:, :2] = 10 * torch.stack([angles.cos(), angles.sin()], dim=-1)
        attn = tiny_model.blocks[L].attn
        attn.W_Q[H] = 0.0
        attn.W_K[H] = 0.0
        attn.b_Q[H] = 0.0
        attn.b_K[H] = 0.0
        c, s = math.cos(theta), math.sin(theta)
        attn.W_Q[H, :2, :2] = 3 * torch.tensor([[c, -s], [s, c]])  # [cos a, sin a] -> [cos(a - t), sin(a - t)]
        attn.W_K[H, :2, :2] = 3 * torch.eye(2)
    tokens = torch.randint(0, tiny_model.cfg.d_vocab, (3, n_pos), generator=torch.Generator().manual_seed(0))
    _, cache = tiny_model.run_with_cache(tokens)
    scores = ins.previous_token_scores(cache)
    assert scores.shape == (2, 4)
    assert divmod(int(scores.argmax()), 4) == (L, H)
    assert scores[L, H] > 0.9
    others = torch.cat([scores.flatten()[: L * 4 + H], scores.flatten()[L * 4 + H + 1 :]])
    assert others.max() < 0.7


def test_planted_heads_model_scores_its_heads() -> None:
    model = ins.planted_heads_model()
    scores = ins.head_scores(model, seq_len=12, batch_size=4)
    assert set(scores) == {"previous token", "duplicate token", "induction"}
    for name, (layer, head) in [("previous token", (0, 0)), ("duplicate token", (0, 1)), ("induction", (1, 0))]:
        s = scores[name]
        assert s.shape == (2, 4)
        assert divmod(int(s.argmax()), 4) == (layer, head), (name, s)
        assert s[layer, head] > 0.85, (name, s)
    # and the induction head makes the model predict the second half of a repeated sequence
    half = torch.randperm(15, generator=torch.Generator().manual_seed(0))[:10]
    tokens = torch.cat([torch.tensor([15]), half, half])[None]
    predictions = model(tokens).argmax(-1)[0]
    assert torch.equal(predictions[11:-1], tokens[0, 12:])


# ----------------------------------------------------------------------------
# the residual stream
# ----------------------------------------------------------------------------
def test_logit_lens_ends_at_the_models_logits(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    logits, cache = tiny_model.run_with_cache(tiny_tokens)
    lens, labels = ins.logit_lens(cache, batch=1)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert lens.shape == (3, 7, tiny_model.cfg.d_vocab)
    torch.testing.assert_close(lens[-1], logits[1], atol=1e-4, rtol=1e-4)
    # the first entry: ln_final and the unembedding applied to the embeddings
    resid = cache["resid_pre", 0][1]
    ln = tiny_model.ln_final
    centred = resid - resid.mean(-1, keepdim=True)
    normed = centred / (centred.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt() * ln.w + ln.b
    torch.testing.assert_close(lens[0], normed @ tiny_model.W_U + tiny_model.unembed.b_U, atol=1e-4, rtol=1e-4)
    with_mid, mid_labels = ins.logit_lens(cache, incl_mid=True)
    assert mid_labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"] and with_mid.shape[0] == 5


def test_answer_lens_and_resid_norms(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    lens, labels = ins.logit_lens(cache)
    logits, probs, answer_labels = ins.answer_lens(cache, answer=42, pos=3)
    assert answer_labels == labels
    torch.testing.assert_close(logits, lens[:, 3, 42])
    torch.testing.assert_close(probs, lens[:, 3].softmax(-1)[:, 42])

    norms, labels = ins.resid_norms(cache, batch=1)
    assert norms.shape == (3, 7)
    torch.testing.assert_close(norms[0], cache["resid_pre", 0][1].norm(dim=-1))
    torch.testing.assert_close(norms[-1], cache["resid_post", 1][1].norm(dim=-1))


def test_direct_logit_attribution_adds_up_to_the_logit_difference(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    logits, cache = tiny_model.run_with_cache(tiny_tokens)
    answer, wrong = torch.tensor([3, 50]), torch.tensor([7, 8])  # one per prompt
    attrs, labels = ins.direct_logit_attribution(cache, answer, wrong, pos=-1, batch=None)
    n_heads = tiny_model.cfg.n_heads
    assert labels[:2] == ["embed", "pos_embed"] and labels[2 : 2 + n_heads] == [f"L0H{h}" for h in range(n_heads)]
    assert labels[-4:] == ["L0 MLP", "L1 MLP", "attn biases", "unembed biases"]
    assert attrs.shape == (len(labels),) == (2 + 2 * n_heads + 2 + 2,)
    diffs = logits[[0, 1], -1, answer] - logits[[0, 1], -1, wrong]
    torch.testing.assert_close(attrs.sum(), diffs.mean(), atol=1e-4, rtol=1e-4)
    for b in range(2):
        one, _ = ins.direct_logit_attribution(cache, int(answer[b]), int(wrong[b]), batch=b)
        torch.testing.assert_close(one.sum(), diffs[b], atol=1e-4, rtol=1e-4)
    # one head by hand: its output, centred, over ln_final's cached scale, times w, on the direction
    z = cache["z", 1][0, -1, 2]
    out = z @ tiny_model.blocks[1].attn.W_O[2]
    direction = (tiny_model.W_U[:, 3] - tiny_model.W_U[:, 7]) * tiny_model.ln_final.w
    by_hand = ((out - out.mean()) / cache["ln_final.hook_scale"][0, -1]) @ direction
    single, labels = ins.direct_logit_attribution(cache, 3, 7, batch=0)
    torch.testing.assert_close(single[labels.index("L1H2")], by_hand, atol=1e-5, rtol=1e-4)


def test_accumulated_logit_diff_ends_at_the_models(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    logits, cache = tiny_model.run_with_cache(tiny_tokens)
    diffs, labels = ins.accumulated_logit_diff(cache, 3, 7, pos=-2)
    assert diffs.shape == (3, 2) and labels[-1] == "final_post"
    torch.testing.assert_close(diffs[-1], logits[:, -2, 3] - logits[:, -2, 7], atol=1e-4, rtol=1e-4)
    lens, _ = ins.logit_lens(cache, batch=1)
    torch.testing.assert_close(diffs[:, 1], lens[:, -2, 3] - lens[:, -2, 7])


# ----------------------------------------------------------------------------
# bad input: clear errors naming the argument, the value and what was expected
# ----------------------------------------------------------------------------
def test_bad_input_errors(tiny_model: GPT, tiny_tokens: torch.Tensor) -> None:
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    with pytest.raises(TypeError, match="cache must be an ActivationCache"):
        ins.previous_token_scores(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"tokens has shape \(2, 6\).*\[2, 7\]"):
        ins.duplicate_token_scores(cache, tiny_tokens[:, :6])
    with pytest.raises(ValueError, match="no token in `tokens` occurs twice"):
        ins.duplicate_token_scores(cache, torch.arange(14).reshape(2, 7))
    with pytest.raises(ValueError, match=r"batch=5 is out of range: the cache's 2 prompts are 0..1"):
        ins.logit_lens(cache, batch=5)
    with pytest.raises(ValueError, match=r"pos=9 is out of range: the 7 positions are 0..6"):
        ins.direct_logit_attribution(cache, 1, 2, pos=9)
    with pytest.raises(ValueError, match=r"answer: token id 100 is out of range .* 100 \(ids 0..99\)"):
        ins.answer_lens(cache, 100)
    with pytest.raises(ValueError, match="answer gives 3 tokens for a batch of 2"):
        ins.direct_logit_attribution(cache, [1, 2, 3])
    with pytest.raises(ValueError, match="seq_len=20 makes 41 tokens, longer than the context of 32"):
        ins.repeated_tokens(tiny_model, seq_len=20)
    _, partial = tiny_model.run_with_cache(tiny_tokens, names_filter="blocks.0.attn.hook_pattern")
    with pytest.raises(KeyError, match="holds no 'blocks.1.attn.hook_pattern'.*names_filter"):
        ins.previous_token_scores(partial)
