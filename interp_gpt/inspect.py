"""Numbers to look at: head scores, the logit lens, residual-stream norms, direct logit
attribution. Every function returns tensors (and labels); `plots.py` draws them.

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

`planted_heads_model` builds a 2-layer model whose heads are set by hand, so these tools
can be checked against known answers (and the pictures show something).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Union

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .cache import ActivationCache
from .config import Config
from .model import GPT

__all__ = [
    "stack_patterns",
    "previous_token_scores",
    "duplicate_token_scores",
    "induction_scores",
    "repeated_tokens",
    "head_scores",
    "accumulated_resid",
    "logit_lens",
    "answer_lens",
    "resid_norms",
    "direct_logit_attribution",
    "accumulated_logit_diff",
    "planted_heads_model",
]

# What names an answer token: an id, a single-token string, or one of those per prompt.
AnswerInput = Union[int, str, Sequence[Union[int, str]], Int[Tensor, " batch"]]


# ----------------------------------------------------------------------------
# input checks shared by the functions below
# ----------------------------------------------------------------------------
def _check_cache(cache: Any, caller: str) -> ActivationCache:
    if not isinstance(cache, ActivationCache):
        raise TypeError(
            f"{caller}: cache must be an ActivationCache (from model.run_with_cache), got {type(cache).__name__}"
        )
    return cache


def _get(cache: ActivationCache, name: str, caller: str) -> Tensor:
    """A cached activation, with the batch axis always present."""
    if name not in cache.cache_dict:
        raise KeyError(
            f"{caller}: the cache holds no {name!r}; run model.run_with_cache without "
            f"names_filter, or with one that keeps {name!r}"
        )
    t = cache.cache_dict[name]
    return t if cache.has_batch_dim else t[None]


def _int(value: Any, arg: str, caller: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{caller}: {arg} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{caller}: {arg} must be an int, got {type(value).__name__} ({value!r})") from None


def _in_range(value: Any, size: int, arg: str, caller: str, what: str) -> int:
    """`value` as an index into an axis of `size` (negative counts from the end)."""
    value = _int(value, arg, caller)
    if not -size <= value < size:
        raise ValueError(
            f"{caller}: {arg}={value} is out of range: {what} are 0..{size - 1} (negative counts from the end)"
        )
    return value % size


def _batch_index(batch: int | None, size: int, caller: str) -> int | None:
    return None if batch is None else _in_range(batch, size, "batch", caller, f"the cache's {size} prompts")


def _token_ids(model: GPT, tokens: AnswerInput, n_batch: int, arg: str, caller: str) -> Int[Tensor, " batch"]:
    """One token id per prompt, from an id, a single-token string, or one of those per prompt."""
    if isinstance(tokens, Tensor):
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise TypeError(f"{caller}: {arg} must hold integer token ids, got dtype {tokens.dtype}")
        ids = tokens.flatten().tolist()
    elif isinstance(tokens, (str, int)) and not isinstance(tokens, bool):
        ids = [tokens]
    elif isinstance(tokens, Sequence):
        ids = list(tokens)
    else:
        raise TypeError(
            f"{caller}: {arg} must be a token id, a single-token string, or one per prompt; got {type(tokens).__name__}"
        )
    out = []
    for t in ids:
        if isinstance(t, str):
            t = model.to_single_token(t)
        elif isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"{caller}: {arg} entries must be ids or strings, got {t!r}")
        if not 0 <= t < model.cfg.d_vocab:
            raise ValueError(
                f"{caller}: {arg}: token id {t} is out of range for a vocabulary of "
                f"{model.cfg.d_vocab} (ids 0..{model.cfg.d_vocab - 1})"
            )
        out.append(t)
    if len(out) == 1:
        out = out * n_batch
    if len(out) != n_batch:
        raise ValueError(f"{caller}: {arg} gives {len(out)} tokens for a batch of {n_batch} prompts")
    return torch.tensor(out, dtype=torch.long)


def _check_tokens(tokens: Any, shape: tuple[int, int], caller: str) -> Int[Tensor, "batch pos"]:
    """Token ids shaped [batch, pos] like the cache (a [pos] tensor or list for one prompt)."""
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{caller}: tokens must be a tensor of token ids, got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError(f"{caller}: tokens must be integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tuple(tokens.shape) != shape:
        raise ValueError(
            f"{caller}: tokens has shape {tuple(tokens.shape)}, but the cached patterns are for "
            f"[batch, pos] = {list(shape)}"
        )
    return tokens


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
    return torch.stack([_get(cache, f"blocks.{L}.attn.hook_pattern", "stack_patterns") for L in range(n)])


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


def _earlier_copies(tokens: Int[Tensor, "batch pos"]) -> Tensor:
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
    target = _earlier_copies(tokens.to(patterns.device))
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
    copies = _earlier_copies(tokens.to(patterns.device))
    target = torch.zeros_like(copies)
    target[:, :, 1:] = copies[:, :, :-1]  # key k+1 for every earlier copy at k
    target &= torch.ones_like(target[0]).tril(-1)  # never the query itself
    if not bool(target.any()):
        raise ValueError(
            "induction_scores: no token in `tokens` occurs twice with a token after its first "
            "copy, so there is nothing to score; use repeated_tokens(...)"
        )
    return _mean_attention_to(patterns, target, "induction_scores")


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
    seq_len = _int(seq_len, "seq_len", caller)
    batch_size = _int(batch_size, "batch_size", caller)
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"{caller}: seq_len and batch_size must be >= 1, got {seq_len} and {batch_size}")
    d_vocab, bos = model.cfg.d_vocab, model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    special = (
        {model.tokenizer.bos_token_id, model.tokenizer.eos_token_id} if model.tokenizer is not None else {d_vocab - 1}
    )
    if low is None:
        low = 100 if d_vocab > 20000 else 0
    if high is None:
        # A small vocabulary: all of it but a special token at its end (end-of-text is the
        # last id in GPT-2-style vocabularies), as [100, 20000) leaves out GPT-2's 50256.
        high = min(20000, d_vocab) if d_vocab > 20000 else d_vocab - int(d_vocab - 1 in special)
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
    if not isinstance(model, GPT):
        raise TypeError(f"head_scores: model must be a GPT, got {type(model).__name__}")
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
    first = _get(cache, "blocks.0.hook_resid_pre", caller)
    b = _batch_index(batch, first.shape[0], caller)
    parts, labels = [], []
    for L in range(n):
        parts.append(_get(cache, f"blocks.{L}.hook_resid_pre", caller)[b])
        labels.append(f"{L}_pre")
        if incl_mid:
            parts.append(_get(cache, f"blocks.{L}.hook_resid_mid", caller)[b])
            labels.append(f"{L}_mid")
    parts.append(_get(cache, f"blocks.{n - 1}.hook_resid_post", caller)[b])
    labels.append("final_post")
    return torch.stack(parts), labels


def _unembed(model: GPT, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
    """ln_final (its statistics computed on `resid` itself) then the unembedding."""
    ln = model.ln_final
    x = resid - resid.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt()
    if ln.has_params:
        x = x * ln.w.detach() + ln.b.detach()
    return x @ model.unembed.W_U.detach() + model.unembed.b_U.detach()


@torch.no_grad()
def logit_lens(
    cache: ActivationCache, batch: int = 0, incl_mid: bool = False
) -> tuple[Float[Tensor, "layer pos d_vocab"], list[str]]:
    """The logit lens: the logits the model would give if it stopped at each layer.

    Each accumulated residual (`accumulated_resid`) goes through ln_final, with its own
    statistics, and the unembedding. The last entry ("final_post") equals the model's logits.

    Example:
        >>> logits, labels = logit_lens(cache)          # [n_layers + 1, pos, d_vocab]
        >>> top_prob, top_token = logits.softmax(-1).max(-1)   # each [n_layers + 1, pos]
    """
    resid, labels = accumulated_resid(cache, batch, incl_mid)
    return _unembed(cache.model, resid), labels


@torch.no_grad()
def answer_lens(
    cache: ActivationCache, answer: int | str, pos: int = -1, batch: int = 0, incl_mid: bool = False
) -> tuple[Float[Tensor, " layer"], Float[Tensor, " layer"], list[str]]:
    """One answer token's logit and probability at position `pos`, across layers (logit lens).

    Returns `(logits, probs, labels)`, each of length n_layers + 1.

    Example:
        >>> logits, probs, labels = answer_lens(cache, " Paris")
    """
    caller = "answer_lens"
    lens, labels = logit_lens(cache, batch, incl_mid)
    p = _in_range(pos, lens.shape[1], "pos", caller, f"the {lens.shape[1]} positions")
    answer_id = int(_token_ids(cache.model, answer, 1, "answer", caller)[0])
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


def _logit_direction(
    cache: ActivationCache, answer: AnswerInput, wrong: AnswerInput | None, n_batch: int, caller: str
) -> Float[Tensor, "batch d_model"]:
    """W_U[:, answer] (minus W_U[:, wrong]) per prompt, times ln_final's weight if it has one."""
    model = cache.model
    W_U = model.unembed.W_U.detach()
    direction = W_U[:, _token_ids(model, answer, n_batch, "answer", caller)].T
    if wrong is not None:
        direction = direction - W_U[:, _token_ids(model, wrong, n_batch, "wrong", caller)].T
    if model.ln_final.has_params:
        direction = direction * model.ln_final.w.detach()
    return direction


def _logit_offset(
    cache: ActivationCache, answer: AnswerInput, wrong: AnswerInput | None, n_batch: int, caller: str
) -> Float[Tensor, " batch"]:
    """What ln_final's bias and b_U add to the logit (difference): no component writes it."""
    model = cache.model
    b_U = model.unembed.b_U.detach()
    bias_dir = (
        model.unembed.W_U.detach().T @ model.ln_final.b.detach() if model.ln_final.has_params else torch.zeros_like(b_U)
    )
    total = b_U + bias_dir
    offset = total[_token_ids(model, answer, n_batch, "answer", caller)]
    if wrong is not None:
        offset = offset - total[_token_ids(model, wrong, n_batch, "wrong", caller)]
    return offset


@torch.no_grad()
def direct_logit_attribution(
    cache: ActivationCache,
    answer: AnswerInput,
    wrong: AnswerInput | None = None,
    pos: int = -1,
    batch: int | None = 0,
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
        >>> attrs, labels = direct_logit_attribution(cache, " Paris", " London")
        >>> attrs.sum()      # == logits[0, -1, paris] - logits[0, -1, london]
    """
    caller = "direct_logit_attribution"
    cache = _check_cache(cache, caller)
    model, cfg = cache.model, cache.model.cfg
    embed = _get(cache, "hook_embed", caller)
    n_batch, n_pos = embed.shape[:2]
    p = _in_range(pos, n_pos, "pos", caller, f"the {n_pos} positions")
    b = _batch_index(batch, n_batch, caller)
    parts = [embed[:, p], _get(cache, "hook_pos_embed", caller)[:, p]]  # each [batch, d_model]
    labels = ["embed", "pos_embed"]
    for L in range(cfg.n_layers):
        z = _get(cache, f"blocks.{L}.attn.hook_z", caller)[:, p]  # [batch, head, d_head]
        W_O = model.blocks[L].attn.W_O.detach().to(z.dtype)
        heads = einops.einsum(z, W_O, "batch head d_head, head d_head d_model -> head batch d_model")
        parts += list(heads)
        labels += [f"L{L}H{h}" for h in range(cfg.n_heads)]
    for L in range(cfg.n_layers):
        parts.append(_get(cache, f"blocks.{L}.hook_mlp_out", caller)[:, p])
        labels.append(f"L{L} MLP")
    b_O = sum(model.blocks[L].attn.b_O.detach() for L in range(cfg.n_layers))
    parts.append(b_O.expand_as(parts[0]))
    labels.append("attn biases")
    stack = torch.stack(parts)  # [component, batch, d_model]
    scale = _get(cache, "ln_final.hook_scale", caller)[:, p]  # [batch, 1]
    normed = (stack - stack.mean(-1, keepdim=True)) / scale
    direction = _logit_direction(cache, answer, wrong, n_batch, caller).to(normed.dtype)
    attrs = (normed * direction).sum(-1)  # [component, batch]
    offset = _logit_offset(cache, answer, wrong, n_batch, caller).to(attrs.dtype)
    attrs = torch.cat([attrs, offset[None]])
    labels.append("unembed biases")
    return (attrs.mean(1) if b is None else attrs[:, b]), labels


@torch.no_grad()
def accumulated_logit_diff(
    cache: ActivationCache,
    answer: AnswerInput,
    wrong: AnswerInput | None = None,
    pos: int = -1,
    incl_mid: bool = False,
) -> tuple[Float[Tensor, "layer batch"], list[str]]:
    """The logit (difference) the residual stream already holds at each layer, per prompt.

    The logit lens at `pos` (`logit_lens`: ln_final with each layer's own statistics, then
    the unembedding), read off at `answer` (minus `wrong`). The last row is the model's own
    logit (difference).

    Example:
        >>> diffs, labels = accumulated_logit_diff(cache, " Paris", " London")   # [n_layers + 1, batch]
    """
    caller = "accumulated_logit_diff"
    cache = _check_cache(cache, caller)
    n_batch = _get(cache, "hook_embed", caller).shape[0]
    answer_ids = _token_ids(cache.model, answer, n_batch, "answer", caller)
    wrong_ids = None if wrong is None else _token_ids(cache.model, wrong, n_batch, "wrong", caller)
    rows, labels = [], []
    for b in range(n_batch):
        lens, labels = logit_lens(cache, b, incl_mid)
        p = _in_range(pos, lens.shape[1], "pos", caller, f"the {lens.shape[1]} positions")
        value = lens[:, p, answer_ids[b]]
        if wrong_ids is not None:
            value = value - lens[:, p, wrong_ids[b]]
        rows.append(value)
    return torch.stack(rows, dim=1), labels


# ----------------------------------------------------------------------------
# a model with known heads
# ----------------------------------------------------------------------------
PLANTED_ALPHABET = "abcdefghijklmno"  # 15 characters; "<|endoftext|>" (id 15) is the 16th token


@torch.no_grad()
def planted_heads_model(seed: int = 0) -> GPT:
    """A 2-layer model whose heads are set by hand, for checking inspection tools.

    - L0H0 is a previous-token head, L0H1 a duplicate-token head, L1H0 an induction head
      that copies the token it attends to into the logits (so the model predicts the
      second half of a repeated sequence); the other heads have small random weights.
    - The residual stream (d_model 128) has one-hot slots: dims 0-31 the position,
      32-47 the token, 48-63 the previous token (written by L0H0), 64-79 the prediction
      (written by L1H0); the MLPs are zero.
    - It carries a character tokenizer over "abcdefghijklmno" (+ "<|endoftext|>" = BOS).

    Example:
        >>> model = planted_heads_model()
        >>> scores = head_scores(model, seq_len=12)
        >>> int(scores["induction"].argmax())        # layer 1, head 0
        4
    """
    from .tokenizer import char_tokenizer

    n_vocab, n_ctx = len(PLANTED_ALPHABET) + 1, 32
    cfg = Config(
        n_layers=2,
        d_model=128,
        n_heads=4,
        d_head=48,
        d_mlp=64,
        d_vocab=n_vocab,
        n_ctx=n_ctx,
        model_name="planted-heads",
    )
    model = GPT(cfg, tokenizer=char_tokenizer(PLANTED_ALPHABET, name="planted"))
    model.init_weights(seed=seed)
    for name, p in model.named_parameters():  # start from nothing but the random heads
        if not name.startswith("blocks.") or ".mlp." in name or name.endswith(("W_O", "b_O")):
            p.zero_()
    for ln in [model.ln_final] + [m for b in model.blocks for m in (b.ln1, b.ln2)]:
        ln.w.fill_(1.0)
    POS, TOK, PREV, PRED = 0, 32, 48, 64  # where each slot starts
    gain = 2.0  # query and key gains: attention scores of about 20 where the pattern is wanted
    positions, tokens = torch.arange(n_ctx), torch.arange(n_vocab)
    model.pos_embed.W_pos[positions, POS + positions] = 1.0
    model.embed.W_E[tokens, TOK + tokens] = 1.0

    prev = model.blocks[0].attn  # head 0: the query at i matches the key at j = i - 1
    for W in (prev.W_Q, prev.W_K, prev.W_V):
        W[0] = 0.0
    prev.W_Q[0, POS + positions, positions] = gain
    prev.W_K[0, POS + positions[:-1], positions[:-1] + 1] = gain
    prev.W_V[0, TOK + tokens, tokens] = 1.0  # ... and copies that token into the PREV slot
    prev.W_O[0, tokens, PREV + tokens] = 1.0 / 8  # the normalised spike is ~8; back to ~1

    dup = model.blocks[0].attn  # head 1: same token (+1), same position (-1): earlier copies
    for W in (dup.W_Q, dup.W_K, dup.W_V):
        W[1] = 0.0
    dup.W_Q[1, TOK + tokens, tokens] = gain
    dup.W_K[1, TOK + tokens, tokens] = gain
    dup.W_Q[1, POS + positions, 16 + positions] = gain
    dup.W_K[1, POS + positions, 16 + positions] = -gain

    ind = model.blocks[1].attn  # head 0: query token == the key's previous token
    for W in (ind.W_Q, ind.W_K, ind.W_V):
        W[0] = 0.0
    ind.W_Q[0, TOK + tokens, tokens] = gain
    ind.W_K[0, PREV + tokens, tokens] = gain
    ind.W_V[0, TOK + tokens, tokens] = 1.0  # copies the attended token ...
    ind.W_O[0, tokens, PRED + tokens] = 1.0 / 6  # ... into the PRED slot
    model.unembed.W_U[PRED + tokens, tokens] = 3.0
    return model.eval()
