"""Finding heads by the attention pattern they show, as transformer-lens' `head_detector`.

`detect_head(model, seq, "induction_head")` scores every head's attention on `seq` against a
detection pattern `[pos, pos]`: a built-in one (`HEAD_NAMES`: previous-token, duplicate-token,
induction) or your own lower-triangular tensor. Same names, arguments, scores and result shape
`[n_layers, n_heads]` as transformer-lens; where transformer-lens fails an `assert`, we raise a
`ValueError` (or `TypeError`) that names the argument. `inspect.head_scores` gives per-query
normalised scores of the same three kinds on repeated random tokens.

    >>> from interp_gpt import head_detector
    >>> head_detector.detect_head(model, "one two three one two three", "induction_head").shape
    torch.Size([2, 4])
"""

from __future__ import annotations

import difflib
import logging
import operator
from collections import defaultdict
from typing import Any, Literal, Union, get_args

import torch
from torch import Tensor

from .inspect import earlier_copies

__all__ = [
    "HEAD_NAMES",
    "detect_head",
    "get_previous_token_head_detection_pattern",
    "get_duplicate_token_head_detection_pattern",
    "get_induction_head_detection_pattern",
    "get_supported_heads",
    "compute_head_attention_similarity_score",
]

HeadName = Literal["previous_token_head", "duplicate_token_head", "induction_head"]
HEAD_NAMES: list[str] = list(get_args(HeadName))
ErrorMeasure = Literal["abs", "mul"]
LayerHeadTuple = tuple[int, int]
LayerToHead = dict[int, list[int]]


def get_previous_token_head_detection_pattern(tokens: Tensor) -> Tensor:
    """`[pos, pos]`: 1 where the key is the query's previous position (tokens `[1, pos]` or `[pos]`)."""
    n = tokens.shape[-1]
    return torch.diag(torch.ones(n - 1), -1)


def get_duplicate_token_head_detection_pattern(tokens: Tensor) -> Tensor:
    """`[pos, pos]`: 1 where the key is an earlier copy of the query's token."""
    return earlier_copies(tokens.reshape(1, -1).cpu())[0].float()


def get_induction_head_detection_pattern(tokens: Tensor) -> Tensor:
    """`[pos, pos]`: 1 where the key is the token just after an earlier copy of the query's token
    (the duplicate pattern shifted one key to the right; the query itself may be such a key)."""
    duplicate = get_duplicate_token_head_detection_pattern(tokens)
    shifted = torch.zeros_like(duplicate)
    shifted[:, 1:] = duplicate[:, :-1]
    return torch.tril(shifted)


_PATTERNS = {
    "previous_token_head": get_previous_token_head_detection_pattern,
    "duplicate_token_head": get_duplicate_token_head_detection_pattern,
    "induction_head": get_induction_head_detection_pattern,
}


def get_supported_heads() -> None:
    """Print the built-in detection pattern names."""
    print(f"Supported heads: {tuple(HEAD_NAMES)}")


def compute_head_attention_similarity_score(
    attention_pattern: Tensor,
    detection_pattern: Tensor,
    *,
    exclude_bos: bool,
    exclude_current_token: bool,
    error_measure: ErrorMeasure,
) -> float:
    """How well one head's `attention_pattern` `[q_pos, k_pos]` matches `detection_pattern`.

    "mul": the share of the attention that falls where the detection pattern is (sum of the
    product over sum of the attention), after zeroing the BOS column / the diagonal if excluded.
    "abs": 1 - the summed absolute difference per query (rounded to 3 decimals), from 1 (a
    perfect match) down to -1. The cached pattern is never modified.
    """
    if attention_pattern.ndim != 2 or attention_pattern.shape[0] != attention_pattern.shape[1]:
        raise ValueError(
            f"compute_head_attention_similarity_score: attention_pattern must be square [pos, pos], "
            f"got shape {tuple(attention_pattern.shape)}"
        )
    if error_measure == "mul":
        if exclude_bos or exclude_current_token:
            attention_pattern = attention_pattern.clone()
        if exclude_bos:
            attention_pattern[:, 0] = 0
        if exclude_current_token:
            attention_pattern.fill_diagonal_(0)
        score = attention_pattern * detection_pattern
        return (score.sum() / attention_pattern.sum()).item()
    abs_diff = (attention_pattern - detection_pattern).abs()
    if exclude_bos:
        abs_diff[:, 0] = 0
    if exclude_current_token:
        abs_diff.fill_diagonal_(0)
    return 1 - round((abs_diff.mean() * len(abs_diff)).item(), 3)


def _check_detection_pattern(detection_pattern: Any, seq_len: int) -> Tensor:
    if not isinstance(detection_pattern, Tensor):
        raise TypeError(
            f"detect_head: detection_pattern must be a [pos, pos] tensor or one of {HEAD_NAMES}, "
            f"got {type(detection_pattern).__name__}"
        )
    shape = tuple(detection_pattern.shape)
    if shape != (seq_len, seq_len):
        raise ValueError(
            f"detect_head: detection_pattern has shape {shape}, expected ({seq_len}, {seq_len}): "
            f"one row and one column per token of seq ({seq_len} tokens, BOS included if prepended)"
        )
    if detection_pattern.is_complex() or not bool(torch.isfinite(detection_pattern.float()).all()):
        raise ValueError("detect_head: detection_pattern must hold finite real numbers")
    if not detection_pattern.equal(detection_pattern.tril()):
        raise ValueError(
            "detect_head: detection_pattern must be lower triangular (a query attends to itself and earlier "
            "keys only); it has non-zero entries above the diagonal"
        )
    return detection_pattern


def _layer_to_heads(heads: Any, n_layers: int, n_heads: int) -> dict[int, list[int]]:
    """`heads` (None, [(layer, head), ...] or {layer: [head, ...]}) as {layer: [head, ...]}, checked."""
    if heads is None:
        return {layer: list(range(n_heads)) for layer in range(n_layers)}
    pairs: list[tuple[Any, Any]]
    if isinstance(heads, dict):
        pairs = [(layer, head) for layer, layer_heads in heads.items() for head in layer_heads]
    elif isinstance(heads, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in heads):
        pairs = [tuple(p) for p in heads]  # type: ignore[misc]
    else:
        raise TypeError(
            f"detect_head: heads must be None, a list of (layer, head) pairs or a dict layer -> [head, ...], got {heads!r}"
        )
    layer2heads: dict[int, list[int]] = defaultdict(list)
    for pair in pairs:
        checked = []
        for arg, value, size in zip(("layer", "head"), pair, (n_layers, n_heads), strict=True):
            index = _as_int(value)  # an int, a numpy int or a 0-d integer tensor
            if index is None or not 0 <= index < size:
                raise ValueError(f"detect_head: heads holds {arg} {value!r}; {arg}s are 0..{size - 1}")
            checked.append(index)
        layer2heads[checked[0]].append(checked[1])
    return layer2heads


def _as_int(value: Any) -> int | None:
    """`value` as an int (an int, a numpy int or a 0-d integer tensor; never a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def detect_head(
    model: Any,
    seq: Union[str, list[str]],
    detection_pattern: Union[Tensor, HeadName],
    heads: Union[list[LayerHeadTuple], LayerToHead, None] = None,
    cache: Any = None,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: ErrorMeasure = "mul",
) -> Tensor:
    """Score every head (or the given `heads`; the others get -1) on how much its attention on
    `seq` looks like `detection_pattern`, as transformer-lens' `detect_head`. Returns `[n_layers, n_heads]`.

    `detection_pattern`: "previous_token_head", "duplicate_token_head", "induction_head" (built
    from `seq`'s tokens), or your own lower-triangular `[pos, pos]` tensor (pos counts the BOS
    that `to_tokens` prepends). `seq`: one prompt, or a list of prompts whose scores are averaged
    (built-in patterns only, since each prompt has its own pattern). `cache`: a cache of `seq`
    (from `model.run_with_cache`) to save the forward. `exclude_bos` / `exclude_current_token`
    leave out the attention to BOS / to the query itself. `error_measure`: "mul" (the share of
    attention on the pattern; the pattern should be 0s and 1s, else a warning is logged) or "abs"
    (1 - mean absolute difference per query, in -1..1).

    Example:
        >>> text = "The cat sat. The cat sat."
        >>> scores = detect_head(model, text, "induction_head")
        >>> layer, head = divmod(int(scores.argmax()), model.cfg.n_heads)
        >>> detect_head(model, text, "previous_token_head", heads=[(0, 1), (1, 3)], exclude_bos=True)
    """
    cfg = model.cfg
    # Phase 1: the arguments; a list of prompts with a built-in pattern: the mean of their scores
    _check_detect_args(seq, detection_pattern, error_measure)
    if isinstance(seq, list):
        if isinstance(detection_pattern, str):
            if cache is not None:
                raise ValueError(
                    "detect_head: cache holds one prompt's activations, so it cannot be given with a list seq; "
                    "pass one prompt at a time, or leave cache out"
                )
            scores = [
                detect_head(
                    model,
                    one_seq,
                    detection_pattern,
                    heads=heads,
                    exclude_bos=exclude_bos,
                    exclude_current_token=exclude_current_token,
                    error_measure=error_measure,
                )
                for one_seq in seq
            ]
            return torch.stack(scores).mean(0)
        if len(seq) > 1:
            raise ValueError(
                f"detect_head: a detection_pattern tensor fits one prompt, got a list of {len(seq)} prompts as seq; "
                "call detect_head once per prompt (or use a built-in pattern name, which is built per prompt)"
            )
        seq = seq[0]

    # Phase 2: the prompt's tokens and its detection pattern
    tokens = model.to_tokens(seq)
    seq_len = tokens.shape[-1]
    if not 1 < seq_len < cfg.n_ctx:
        raise ValueError(
            f"detect_head: seq is {seq_len} tokens; it must be 2..{cfg.n_ctx - 1} (more than one token, and "
            f"within the model's context of {cfg.n_ctx})"
        )
    if isinstance(detection_pattern, str):
        detection_pattern = _PATTERNS[detection_pattern](tokens.cpu())
    detection_pattern = _check_detection_pattern(detection_pattern, seq_len)
    if error_measure == "mul" and not set(detection_pattern.unique().tolist()).issubset({0, 1}):
        logging.warning("Using detection pattern with values other than 0 or 1 with error_measure 'mul'")
    layer2heads = _layer_to_heads(heads, cfg.n_layers, cfg.n_heads)

    # Phase 3: each head's score on the prompt's attention patterns
    if cache is None:
        _, cache = model.run_with_cache(
            tokens, remove_batch_dim=True, names_filter=lambda name: name.endswith("attn.hook_pattern")
        )
    return _head_scores(
        model, cache, detection_pattern, layer2heads, seq_len, exclude_bos, exclude_current_token, error_measure
    )


def _check_detect_args(seq: Any, detection_pattern: Any, error_measure: Any) -> None:
    """Refuse an unknown error measure, a seq that is no prompt (or list of them), an unknown head name."""
    if error_measure not in get_args(ErrorMeasure):
        raise ValueError(f"detect_head: error_measure={error_measure!r} is not one of {list(get_args(ErrorMeasure))}")
    if isinstance(seq, list):
        if not seq or not all(isinstance(s, str) for s in seq):
            raise TypeError(f"detect_head: seq must be a str or a non-empty list of str, got {seq!r}")
    elif not isinstance(seq, str):
        raise TypeError(f"detect_head: seq must be a str or a list of str, got {type(seq).__name__}")
    if isinstance(detection_pattern, str) and detection_pattern not in HEAD_NAMES:
        close = difflib.get_close_matches(detection_pattern, HEAD_NAMES, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"detect_head: detection_pattern={detection_pattern!r} is not a known head name; known: {HEAD_NAMES} "
            f"(or pass a [pos, pos] tensor){hint}"
        )


def _head_scores(
    model: Any,
    cache: Any,
    detection_pattern: Tensor,
    layer2heads: dict[int, list[int]],
    seq_len: int,
    exclude_bos: bool,
    exclude_current_token: bool,
    error_measure: ErrorMeasure,
) -> Tensor:
    """`[n_layers, n_heads]`: each head of `layer2heads` scored on its pattern in `cache`, the others -1."""
    cfg = model.cfg
    dtype = getattr(cfg, "dtype", None) or model.W_E.dtype
    matches = -torch.ones(cfg.n_layers, cfg.n_heads, dtype=dtype)
    for layer, layer_heads in layer2heads.items():
        patterns = cache[f"blocks.{layer}.attn.hook_pattern"]
        if patterns.ndim == 4 and patterns.shape[0] == 1:  # a cache that kept its batch axis of 1
            patterns = patterns[0]
        if patterns.shape[-2:] != (seq_len, seq_len):
            raise ValueError(
                f"detect_head: cache's layer {layer} pattern has shape {tuple(patterns.shape)}, but seq is "
                f"{seq_len} tokens: cache must come from run_with_cache on seq"
            )
        detection = detection_pattern.to(patterns.device, patterns.dtype)
        for head in layer_heads:
            matches[layer, head] = compute_head_attention_similarity_score(
                patterns[head],
                detection_pattern=detection,
                exclude_bos=exclude_bos,
                exclude_current_token=exclude_current_token,
                error_measure=error_measure,
            )
    return matches
