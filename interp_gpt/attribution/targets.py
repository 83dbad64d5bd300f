"""Phase 2 of `attribute`: the logit targets (circuit-tracer's `AttributionTargets`).

Each target is a `d_model` direction read at the unembedding's input (ln_final's output, its scale
frozen) at the last position, with a label and a probability (its weight in influence):

    None               the most probable next tokens, by descending probability, until their cumulative
                       probability reaches `desired_logit_prob` or there are `max_n_logits` of them
    token ids          a 1-D integer tensor (or a list of ints): those tokens, as given
    token strings      each one token of the model's tokenizer
    custom directions  (label, weight, vector [d_model]) tuples: virtual indices d_vocab, d_vocab + 1, ...

A token's direction is `W_U[:, t]` minus the vocabulary's mean column (the logit relative to the mean
logit, as circuit-tracer's demeaned unembedding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .graph import LogitTarget

__all__: list[str] = []

_CALLER = "attribute"


def _decode(model: Any, idx: int) -> str:
    tok = getattr(model, "tokenizer", None)
    return str(tok.decode([idx])) if tok is not None else str(idx)


def _check_unique(ids: list[int], given: list[Any]) -> None:
    """Refuse a token given twice: it would be two logit nodes counted twice in every influence and score, and
    two nodes with one id in the graph's JSON."""
    first: dict[int, int] = {}
    for i, t in enumerate(ids):
        if t in first:
            j = first[t]
            same = f"{given[j]!r} and {given[i]!r} are" if given[j] != given[i] else f"{given[i]!r} is"
            raise ValueError(
                f"{_CALLER}: attribution_targets[{j}] and attribution_targets[{i}]: {same} token {t} twice; "
                "give each target once (a duplicate would count twice in every influence and score)"
            )
        first[t] = i


def logit_targets(
    model: Any, logits: Tensor, targets: Any, max_n_logits: int, desired_logit_prob: float
) -> tuple[list[LogitTarget], Tensor, Tensor]:
    """(targets, probabilities `[n]`, directions `[n, d_model]`) from `logits` `[d_vocab]` (the last
    position's) and the `attribution_targets` argument (checked here, refused by name)."""
    W_U = model.W_U.detach()  # [d_model, d_vocab]
    d_vocab = W_U.shape[1]
    probs = torch.softmax(logits.float(), dim=-1).to(logits.dtype)

    def by_index(idx: Tensor, given: list[Any] | None = None) -> tuple[list[LogitTarget], Tensor, Tensor]:
        if given is not None:
            _check_unique(idx.tolist(), given)
        vecs = (W_U[:, idx] - W_U.mean(dim=-1, keepdim=True)).T
        return [LogitTarget(_decode(model, int(i)), int(i)) for i in idx.tolist()], probs[idx], vecs

    if targets is None:
        top_p, top_idx = torch.topk(probs, min(max_n_logits, d_vocab))
        cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
        return by_index(top_idx[:cutoff])
    if isinstance(targets, Tensor):
        if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool or targets.ndim != 1:
            raise TypeError(
                f"{_CALLER}: attribution_targets: a {targets.dtype} tensor of shape {tuple(targets.shape)}; "
                "expected a 1-D integer tensor of token ids"
            )
        if targets.numel() == 0:
            raise ValueError(f"{_CALLER}: attribution_targets is an empty tensor; pass at least one token id")
        bad = targets[(targets < 0) | (targets >= d_vocab)]
        if bad.numel():
            raise ValueError(
                f"{_CALLER}: attribution_targets: token ids {bad.tolist()} are outside the vocabulary 0..{d_vocab - 1}"
            )
        return by_index(targets.to(torch.long).cpu(), targets.tolist())
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        raise TypeError(
            f"{_CALLER}: attribution_targets={targets!r}: expected None, a tensor of token ids, a list of token "
            "strings or ids, or (label, weight, direction) tuples"
        )
    if len(targets) == 0:
        raise ValueError(f"{_CALLER}: attribution_targets is empty; pass None for the top logits, or some targets")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in targets):
        return logit_targets(model, logits, torch.tensor(list(targets)), max_n_logits, desired_logit_prob)
    if all(isinstance(t, str) for t in targets):
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise ValueError(
                f"{_CALLER}: attribution_targets={list(targets)!r}: token strings need a model with a tokenizer"
            )
        ids = []
        for s in targets:
            enc = model.to_tokens(s, prepend_bos=False)[0].tolist()
            if len(enc) != 1:
                raise ValueError(
                    f"{_CALLER}: attribution_targets: {s!r} is {len(enc)} tokens {enc}; each target must be one token"
                )
            ids.append(enc[0])
        return by_index(torch.tensor(ids), list(targets))
    if all(isinstance(t, tuple) for t in targets):
        labels, weights, vecs = [], [], []
        d_model = W_U.shape[0]
        for i, t in enumerate(targets):
            ok = len(t) == 3 and isinstance(t[0], str) and isinstance(t[1], (int, float)) and not isinstance(t[1], bool)
            if not ok or not isinstance(t[2], Tensor) or not t[2].is_floating_point():
                raise TypeError(
                    f"{_CALLER}: attribution_targets[{i}]={t!r}: expected (label: str, weight: float, direction: "
                    f"a float tensor [d_model={d_model}])"
                )
            if tuple(t[2].shape) != (d_model,):
                raise ValueError(
                    f"{_CALLER}: attribution_targets[{i}]: direction has shape {tuple(t[2].shape)}; expected ({d_model},)"
                )
            if not math.isfinite(t[1]) or t[1] < 0:
                raise ValueError(
                    f"{_CALLER}: attribution_targets[{i}]: weight={t[1]!r}; expected a finite number >= 0 (its share "
                    "of the influence, as a token target's probability)"
                )
            if not bool(torch.isfinite(t[2]).all()):
                raise ValueError(
                    f"{_CALLER}: attribution_targets[{i}]: direction holds a nan or inf; expected finite numbers"
                )
            labels.append(LogitTarget(t[0], d_vocab + i))
            weights.append(float(t[1]))
            vecs.append(t[2].detach().to(W_U.dtype).to(W_U.device))
        if not sum(weights) > 0:
            raise ValueError(
                f"{_CALLER}: attribution_targets: every weight is 0; at least one target needs a weight > 0 (the "
                "influences are shares of the weights' sum)"
            )
        return labels, torch.tensor(weights), torch.stack(vecs)
    raise TypeError(
        f"{_CALLER}: attribution_targets={list(targets)!r}: mixes kinds; pass all token ids, all token strings, "
        "or all (label, weight, direction) tuples"
    )
