"""Numbers to look at: head scores, the logit lens, residual-stream norms, direct logit
attribution. Every function returns tensors (and labels); `plots` draws them.

Head scores, one number per (layer, head), each in [0, 1]:

    previous_token_scores    mean attention from each position to the one before it
    duplicate_token_scores   mean attention to earlier copies of the current token
    induction_scores         mean attention to the token *after* an earlier copy of the
                             current token; on repeated random tokens (`repeated_tokens`)
                             this is transformer-lens' induction score
    head_scores              all three on repeated random tokens, in one call

The residual stream, read at every layer (labels `"0_pre"`, `"1_pre"`, ..., `"final_post"`,
the names `ActivationCache.accumulated_resid` uses):

    logit_lens               logits [layer, pos, d_vocab] if the model stopped at each layer
    answer_lens              one answer's logit and probability across layers
    resid_norms              the residual stream's norm [layer, pos]
    direct_logit_attribution each component's direct effect on a logit (difference)
    accumulated_logit_diff   the logit difference the stream already holds at each layer

`planted_heads_model` (from `planted.py`) builds a 2-layer model whose heads are set by hand,
so these tools can be checked against known answers (and the pictures show something).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .cache import ActivationCache
from .checks import (
    cached_activation,
    check_answer_tokens,
    check_index,
    check_int_in_range,
    check_integer_tensor,
    check_shape,
    check_type,
)
from .model.gpt import GPT, LayerNorm
from .planted import PLANTED_ALPHABET as PLANTED_ALPHABET
from .planted import planted_heads_model

__all__ = [
    "stack_patterns",
    "previous_token_scores",
    "duplicate_token_scores",
    "induction_scores",
    "repeated_tokens",
    "head_scores",
    "accumulated_resid",
    "cache_logit_lens",
    "logit_lens",
    "answer_lens",
    "resid_norms",
    "direct_logit_attribution",
    "accumulated_logit_diff",
    "planted_heads_model",
]

# What names an answer token: an id, a single-token string, or one of those per prompt.
AnswerInput = Union[int, str, Sequence[Union[int, str]], Int[Tensor, " batch"]]


def _check_cache(cache: Any, caller: str) -> ActivationCache:
    return check_type(cache, ActivationCache, "cache", "an ActivationCache (from model.run_with_cache)", caller)


def _batch_index(batch: int | None, size: int, caller: str) -> int | None:
    return None if batch is None else check_index(batch, size, "batch", f"the cache's {size} prompts", caller=caller)


def _pos_index(pos: int, size: int, caller: str) -> int:
    return check_index(pos, size, "pos", f"the {size} positions", caller=caller)


def _check_tokens(tokens: Any, shape: tuple[int, int], caller: str) -> Int[Tensor, "batch pos"]:
    """Token ids shaped [batch, pos] like the cache (a [pos] tensor or list for one prompt)."""
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens)
    tokens = check_integer_tensor(
        check_type(tokens, Tensor, "tokens", "a tensor of token ids", caller), "tokens", caller
    )
    if tokens.ndim == 1:
        tokens = tokens[None]
    return check_shape(tokens, shape, "tokens", "[batch, pos] of the cached patterns", caller)


# ----------------------------------------------------------------------------
# head scores
# ----------------------------------------------------------------------------
def stack_patterns(cache: ActivationCache) -> Float[Tensor, "n_layers batch n_heads q_pos k_pos"]:
    """Every layer's attention pattern from a cache, stacked (a batch axis always present).

    Example:
        >>> _, cache = model.run_with_cache(tokens)
        >>> stack_patterns(cache).shape       # [n_layers, batch, n_heads, q_pos, k_pos]
    """
    cache = _check_cache(cache, "stack_patterns")
    n = cache.model.cfg.n_layers
    return torch.stack([cached_activation(cache, f"blocks.{L}.attn.hook_pattern", "stack_patterns") for L in range(n)])


def _mean_attention_to(
    patterns: Float[Tensor, "n_layers batch n_heads q_pos k_pos"],
    target: Float[Tensor, "batch q_pos k_pos"],
    caller: str,
) -> Float[Tensor, "n_layers n_heads"]:
    """Attention on the `target` keys of each query, averaged over the queries with any target."""
    has_target = target.sum(-1) > 0  # [batch, q_pos]
    if not bool(has_target.any()):
        raise ValueError(f"{caller}: no query position has a key to score (see the docstring)")
    on_target = einops.einsum(patterns, target.to(patterns.dtype), "L batch head q k, batch q k -> L head batch q")
    return on_target[..., has_target].mean(-1)


def previous_token_scores(cache: ActivationCache) -> Float[Tensor, "n_layers n_heads"]:
    """Each head's mean attention from a position to the one just before it.

    Averaged over the batch and over positions 1.. (position 0 has no previous token).
    1 means the head always attends to the previous token.

    Example:
        >>> _, cache = model.run_with_cache(tokens)
        >>> scores = previous_token_scores(cache)          # [n_layers, n_heads]
        >>> layer, head = divmod(int(scores.argmax()), model.cfg.n_heads)
    """
    patterns = stack_patterns(_check_cache(cache, "previous_token_scores"))
    n_batch, n_pos = patterns.shape[1], patterns.shape[-1]
    if n_pos < 2:
        raise ValueError("previous_token_scores: needs at least 2 positions, the cache has 1")
    target = torch.diag(torch.ones(n_pos - 1), -1).expand(n_batch, n_pos, n_pos)
    return _mean_attention_to(patterns, target.to(patterns.device), "previous_token_scores")


def earlier_copies(tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """[batch, q, k]: True where k < q and tokens[k] == tokens[q]."""
    same = tokens[:, :, None] == tokens[:, None, :]
    return same & torch.ones_like(same[0]).tril(-1)


def duplicate_token_scores(
    cache: ActivationCache, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "n_layers n_heads"]:
    """Each head's mean attention to earlier copies of the current token.

    `tokens` are the ids the cache was run on ([batch, pos], or [pos] for one prompt).
    Averaged over the (prompt, position) pairs whose token occurred before. This is the
    duplicate-token detection pattern of transformer-lens' `detect_head`, normalised per
    query instead of over the whole pattern, so 1 means "always attends to a copy".

    Example:
        >>> tokens = model.to_tokens("the cat and the dog and the cat")
        >>> _, cache = model.run_with_cache(tokens)
        >>> duplicate_token_scores(cache, tokens)           # [n_layers, n_heads]
    """
    patterns = stack_patterns(_check_cache(cache, "duplicate_token_scores"))
    tokens = _check_tokens(tokens, (patterns.shape[1], patterns.shape[-1]), "duplicate_token_scores")
    target = earlier_copies(tokens.to(patterns.device))
    if not bool(target.any()):
        raise ValueError("duplicate_token_scores: no token in `tokens` occurs twice, so there is nothing to score")
    return _mean_attention_to(patterns, target, "duplicate_token_scores")


def induction_scores(cache: ActivationCache, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "n_layers n_heads"]:
    """Each head's mean attention to the token just after an earlier copy of the current token.

    That is what an induction head does: at "... A B ... A" it attends to B. Averaged over
    the (prompt, position) pairs with such an earlier copy. On repeated random tokens
    (`repeated_tokens`) this is the induction score of transformer-lens' tutorials and
    evals: the attention along the diagonal one repeat back, plus any chance repeats.

    Example:
        >>> tokens = repeated_tokens(model, seq_len=20, batch_size=4)
        >>> _, cache = model.run_with_cache(tokens)
        >>> induction_scores(cache, tokens)                 # [n_layers, n_heads]
    """
    patterns = stack_patterns(_check_cache(cache, "induction_scores"))
    tokens = _check_tokens(tokens, (patterns.shape[1], patterns.shape[-1]), "induction_scores")
    copies = earlier_copies(tokens.to(patterns.device))
    target = torch.zeros_like(copies)
    target[:, :, 1:] = copies[:, :, :-1]  # key k+1 for every earlier copy at k
    target &= torch.ones_like(target[0]).tril(-1)  # never the query itself
    if not bool(target.any()):
        raise ValueError(
            "induction_scores: no token in `tokens` occurs twice with a token after its first "
            "copy, so there is nothing to score; use repeated_tokens(...)"
        )
    return _mean_attention_to(patterns, target, "induction_scores")


def random_token_range(model: Any) -> tuple[int, int]:
    """The ids `[low, high)` random-token tests draw from: transformer-lens' [100, 20000) for a
    GPT-2-sized vocabulary; for a small one, all of it but a special token at its end (end-of-text
    is the last id in GPT-2-style vocabularies, as [100, 20000) leaves out GPT-2's 50256)."""
    d_vocab, tok = model.cfg.d_vocab, model.tokenizer
    if d_vocab > 20000:
        return 100, 20000
    special = {tok.bos_token_id, tok.eos_token_id} if tok is not None else {d_vocab - 1}
    return 0, d_vocab - int(d_vocab - 1 in special)


def repeated_tokens(
    model: GPT,
    seq_len: int = 50,
    batch_size: int = 8,
    seed: int = 0,
    prepend_bos: bool | None = None,
    low: int | None = None,
    high: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """Random token sequences, each repeated twice: [batch, 2 * seq_len (+ 1 with BOS)].

    As transformer-lens' `evals.induction_loss` draws them: ids uniform in [100, 20000)
    (for a small vocabulary [low, high) defaults to all ids but an end-of-text id at its end),
    repeated, with BOS first when `prepend_bos` (default `cfg.default_prepend_bos`; the
    tokenizer's bos id, or the last id for a model without a tokenizer). transformer-lens
    overwrites the first token with BOS; we put BOS in front, so both halves are whole.
    Seeded, so the same call gives the same tokens.

    Example:
        >>> tokens = repeated_tokens(model, seq_len=3, batch_size=1)
        >>> tokens.shape, bool((tokens[0, 1:4] == tokens[0, 4:7]).all())
        (torch.Size([1, 7]), True)
    """
    caller = "repeated_tokens"
    seq_len = check_int_in_range(seq_len, "seq_len", 1, None, caller=caller)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    d_vocab, bos = model.cfg.d_vocab, model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    default_low, default_high = random_token_range(model)
    low = default_low if low is None else low
    high = default_high if high is None else high
    if not 0 <= low < high <= d_vocab:
        raise ValueError(f"{caller}: need 0 <= low < high <= d_vocab={d_vocab}, got low={low}, high={high}")
    n_pos = 2 * seq_len + int(bool(bos))
    if n_pos > model.cfg.n_ctx:
        raise ValueError(
            f"{caller}: seq_len={seq_len} makes {n_pos} tokens, longer than the context of {model.cfg.n_ctx}"
        )
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(low, high, (batch_size, seq_len), generator=gen)
    tokens = torch.cat([half, half], dim=1)
    if bos:
        bos_id = model.tokenizer.bos_token_id if model.tokenizer is not None else d_vocab - 1
        tokens = torch.cat([torch.full((batch_size, 1), bos_id), tokens], dim=1)
    return tokens


@torch.no_grad()
def head_scores(
    model: GPT, seq_len: int | None = None, batch_size: int = 8, seed: int = 0
) -> dict[str, Float[Tensor, "n_layers n_heads"]]:
    """Previous-token, duplicate-token and induction scores of every head, on repeated
    random tokens (`repeated_tokens`), as transformer-lens' induction evals measure them.

    Returns `{"previous token": ..., "duplicate token": ..., "induction": ...}`, each
    [n_layers, n_heads]; `plots.head_scores_heatmap` draws the dict. `seq_len` defaults to
    50, or what fits the context.

    Example:
        >>> scores = head_scores(model, seq_len=20)
        >>> scores["induction"].shape               # [n_layers, n_heads]
    """
    model = check_type(model, GPT, "model", "a GPT", "head_scores")
    if seq_len is None:
        seq_len = min(50, (model.cfg.n_ctx - 1) // 2)
    tokens = repeated_tokens(model, seq_len, batch_size, seed)
    _, cache = model.run_with_cache(
        tokens.to(model.W_E.device), names_filter=lambda name: name.endswith("hook_pattern"), return_type=None
    )
    tokens = tokens.to(cache["pattern", 0].device)
    return {
        "previous token": previous_token_scores(cache),
        "duplicate token": duplicate_token_scores(cache, tokens),
        "induction": induction_scores(cache, tokens),
    }


# ----------------------------------------------------------------------------
# the residual stream, layer by layer
# ----------------------------------------------------------------------------
def accumulated_resid(
    cache: ActivationCache, batch: int = 0, incl_mid: bool = False
) -> tuple[Float[Tensor, "layer pos d_model"], list[str]]:
    """The residual stream of one prompt entering each layer, and after the last one.

    Labels `"0_pre"`, (`"0_mid"` with `incl_mid`), `"1_pre"`, ..., `"final_post"`.

    Example:
        >>> resid, labels = accumulated_resid(cache)      # [n_layers + 1, pos, d_model]
    """
    caller = "accumulated_resid"
    cache = _check_cache(cache, caller)
    n = cache.model.cfg.n_layers
    first = cached_activation(cache, "blocks.0.hook_resid_pre", caller)
    b = _batch_index(batch, first.shape[0], caller)
    parts, labels = [], []
    for L in range(n):
        parts.append(cached_activation(cache, f"blocks.{L}.hook_resid_pre", caller)[b])
        labels.append(f"{L}_pre")
        if incl_mid:
            parts.append(cached_activation(cache, f"blocks.{L}.hook_resid_mid", caller)[b])
            labels.append(f"{L}_mid")
    parts.append(cached_activation(cache, f"blocks.{n - 1}.hook_resid_post", caller)[b])
    labels.append("final_post")
    return torch.stack(parts), labels


def _unembed(model: GPT, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
    """ln_final (its statistics computed on `resid` itself) then the unembedding."""
    ln = model.ln_final
    x = resid
    if isinstance(ln, LayerNorm):  # (normalization_type=None: no LayerNorm at all)
        x = x - x.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt()
        if ln.has_params:
            x = x * ln.w.detach() + ln.b.detach()
    return x @ model.unembed.W_U.detach() + model.unembed.b_U.detach()


@torch.no_grad()
def cache_logit_lens(
    cache: ActivationCache, batch: int = 0, incl_mid: bool = False
) -> tuple[Float[Tensor, "layer pos d_vocab"], list[str]]:
    """The logit lens of one prompt of a cache you already have: the logits the model would give if it
    stopped at each layer (`interp_gpt.lenses.logit_lens` runs the model on a batch instead).

    Each accumulated residual (`accumulated_resid`) goes through ln_final, with its own
    statistics, and the unembedding. The last entry ("final_post") equals the model's logits.
    Also importable as `logit_lens`, its first name here.

    Example:
        >>> logits, labels = cache_logit_lens(cache)          # [n_layers + 1, pos, d_vocab]
        >>> top_prob, top_token = logits.softmax(-1).max(-1)   # each [n_layers + 1, pos]
    """
    resid, labels = accumulated_resid(cache, batch, incl_mid)
    return _unembed(cache.model, resid), labels


logit_lens = cache_logit_lens  # the first name (interp_gpt.inspect.logit_lens), kept for code that uses it


@torch.no_grad()
def answer_lens(
    cache: ActivationCache, answer: int | str, pos: int = -1, batch: int = 0, incl_mid: bool = False
) -> tuple[Float[Tensor, " layer"], Float[Tensor, " layer"], list[str]]:
    """One answer token's logit and probability at position `pos`, across layers (logit lens).

    Returns `(logits, probs, labels)`, each of length n_layers + 1.

    Example:
        >>> logits, probs, labels = answer_lens(cache, " him")
    """
    caller = "answer_lens"
    lens, labels = logit_lens(cache, batch, incl_mid)
    p = _pos_index(pos, lens.shape[1], caller)
    answer_id = int(check_answer_tokens(cache.model, answer, 1, "answer", caller)[0])
    logits = lens[:, p]
    return logits[:, answer_id], logits.softmax(-1)[:, answer_id], labels


@torch.no_grad()
def resid_norms(
    cache: ActivationCache, batch: int = 0, incl_mid: bool = False
) -> tuple[Float[Tensor, "layer pos"], list[str]]:
    """The L2 norm of the residual stream at each layer and position.

    Example:
        >>> norms, labels = resid_norms(cache)          # [n_layers + 1, pos]
    """
    resid, labels = accumulated_resid(cache, batch, incl_mid)
    return resid.norm(dim=-1), labels


def _logit_readout(
    cache: ActivationCache, answer: AnswerInput, wrong: AnswerInput | None, n_batch: int, caller: str
) -> tuple[Float[Tensor, "batch d_model"], Float[Tensor, " batch"]]:
    """How the logit (difference) of each prompt reads the normalised final residual stream:
    the direction W_U[:, answer] (minus W_U[:, wrong]), times ln_final's weight if it has one,
    and the offset that ln_final's bias and b_U add (no component writes it)."""
    model = cache.model
    W_U, b_U = model.unembed.W_U.detach(), model.unembed.b_U.detach()
    ids = check_answer_tokens(model, answer, n_batch, "answer", caller)
    direction, total = W_U[:, ids].T, b_U
    if model.ln_final.has_params:
        total = b_U + W_U.T @ model.ln_final.b.detach()
    offset = total[ids]
    if wrong is not None:
        wrong_ids = check_answer_tokens(model, wrong, n_batch, "wrong", caller)
        direction, offset = direction - W_U[:, wrong_ids].T, offset - total[wrong_ids]
    if model.ln_final.has_params:
        direction = direction * model.ln_final.w.detach()
    return direction, offset


@torch.no_grad()
def direct_logit_attribution(
    cache: ActivationCache, answer: AnswerInput, wrong: AnswerInput | None = None, pos: int = -1, batch: int | None = 0
) -> tuple[Float[Tensor, " component"], list[str]]:
    """Each component's direct contribution to the answer's logit (minus `wrong`'s) at `pos`.

    Components: `"embed"`, `"pos_embed"`, every head `"L{l}H{h}"` (its hook_z times W_O),
    every MLP `"L{l} MLP"`, `"attn biases"` (the b_O of all layers) and `"unembed biases"`
    (b_U, and ln_final's bias when the weights are unprocessed). ln_final's scale is the one
    cached for the whole stream, so the attributions add up exactly to the model's logit
    (difference). `answer` / `wrong`: a token id or single-token string, or one per prompt.
    `batch=None` averages over the prompts.

    Example:
        >>> _, cache = model.run_with_cache("The Eiffel Tower is in the city of")
        >>> attrs, labels = direct_logit_attribution(cache, " him", " her")
        >>> attrs.sum()      # == logits[0, -1, paris] - logits[0, -1, london]
    """
    caller = "direct_logit_attribution"
    cache = _check_cache(cache, caller)
    model, cfg = cache.model, cache.model.cfg
    embed = cached_activation(cache, "hook_embed", caller)
    n_batch, n_pos = embed.shape[:2]
    p = _pos_index(pos, n_pos, caller)
    b = _batch_index(batch, n_batch, caller)
    parts, labels = [embed[:, p]], ["embed"]  # each [batch, d_model]
    if cfg.positional_embedding_type != "shortformer":  # (a shortformer's pos_embed never enters the stream)
        parts.append(cached_activation(cache, "hook_pos_embed", caller)[:, p])
        labels.append("pos_embed")
    for L in range(cfg.n_layers):
        z = cached_activation(cache, f"blocks.{L}.attn.hook_z", caller)[:, p]  # [batch, head, d_head]
        W_O = model.blocks[L].attn.W_O.detach().to(z.dtype)
        heads = einops.einsum(z, W_O, "batch head d_head, head d_head d_model -> head batch d_model")
        parts += list(heads)
        labels += [f"L{L}H{h}" for h in range(cfg.n_heads)]
    for L in range(0 if cfg.attn_only else cfg.n_layers):
        parts.append(cached_activation(cache, f"blocks.{L}.hook_mlp_out", caller)[:, p])
        labels.append(f"L{L} MLP")
    b_O = sum(model.blocks[L].attn.b_O.detach() for L in range(cfg.n_layers))
    parts.append(b_O.expand_as(parts[0]))
    labels.append("attn biases")
    stack = torch.stack(parts)  # [component, batch, d_model]
    if cfg.normalization_type is None:  # no ln_final
        normed = stack
    else:
        scale = cached_activation(cache, "ln_final.hook_scale", caller)[:, p]  # [batch, 1]
        normed = (stack - stack.mean(-1, keepdim=True)) / scale
    direction, offset = _logit_readout(cache, answer, wrong, n_batch, caller)
    attrs = (normed * direction.to(normed.dtype)).sum(-1)  # [component, batch]
    attrs = torch.cat([attrs, offset.to(attrs.dtype)[None]])
    labels.append("unembed biases")
    return (attrs.mean(1) if b is None else attrs[:, b]), labels


@torch.no_grad()
def accumulated_logit_diff(
    cache: ActivationCache, answer: AnswerInput, wrong: AnswerInput | None = None, pos: int = -1, incl_mid: bool = False
) -> tuple[Float[Tensor, "layer batch"], list[str]]:
    """The logit (difference) the residual stream already holds at each layer, per prompt.

    The logit lens at `pos` (`logit_lens`: ln_final with each layer's own statistics, then
    the unembedding), read off at `answer` (minus `wrong`). The last row is the model's own
    logit (difference).

    Example:
        >>> diffs, labels = accumulated_logit_diff(cache, " him", " her")   # [n_layers + 1, batch]
    """
    caller = "accumulated_logit_diff"
    cache = _check_cache(cache, caller)
    n_batch = cached_activation(cache, "hook_embed", caller).shape[0]
    answer_ids = check_answer_tokens(cache.model, answer, n_batch, "answer", caller)
    wrong_ids = None if wrong is None else check_answer_tokens(cache.model, wrong, n_batch, "wrong", caller)
    rows: list[Tensor] = []
    labels: list[str] = []
    for b in range(n_batch):
        lens, labels = logit_lens(cache, b, incl_mid)
        p = _pos_index(pos, lens.shape[1], caller)
        value = lens[:, p, answer_ids[b]]
        if wrong_ids is not None:
            value = value - lens[:, p, wrong_ids[b]]
        rows.append(value)
    return torch.stack(rows, dim=1), labels
