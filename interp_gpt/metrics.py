"""Patching metrics: functions from logits to one number, as the patching sweeps expect.

The IOI convention (ARENA, transformer-lens' demos): `answer_tokens` is `[batch, 2]`,
column 0 the correct answer and column 1 the wrong one, both read at the last position.

Example:
    >>> answers = torch.tensor([[mary_id, john_id]])                  # [batch, 2]
    >>> clean_ld = logit_diff(clean_logits, answers)
    >>> metric = normalized_logit_diff(answers, clean_logits, corrupted_logits)
    >>> metric(clean_logits), metric(corrupted_logits)                  # 1.0, 0.0
    >>> results = patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)
"""

from __future__ import annotations

from collections.abc import Callable

from jaxtyping import Float, Int
from torch import Tensor

Metric = Callable[[Float[Tensor, "batch pos d_vocab"]], Float[Tensor, ""]]


def _check_logits_and_answers(logits: Tensor, answer_tokens: Tensor) -> None:
    if not isinstance(logits, Tensor) or logits.ndim != 3:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits: expected a tensor [batch, pos, d_vocab], got {got}")
    if not isinstance(answer_tokens, Tensor) or answer_tokens.ndim != 2 or answer_tokens.shape[1] != 2:
        got = tuple(answer_tokens.shape) if isinstance(answer_tokens, Tensor) else type(answer_tokens).__name__
        raise ValueError(f"answer_tokens: expected an integer tensor [batch, 2] (correct, wrong), got {got}")
    if answer_tokens.is_floating_point():
        raise TypeError(f"answer_tokens: expected integer token ids, got dtype {answer_tokens.dtype}")
    if answer_tokens.shape[0] != logits.shape[0]:
        raise ValueError(
            f"answer_tokens has {answer_tokens.shape[0]} rows but logits has batch {logits.shape[0]}: "
            "give one (correct, wrong) pair per prompt"
        )
    d_vocab = logits.shape[-1]
    bad = (answer_tokens < 0) | (answer_tokens >= d_vocab)
    if bool(bad.any()):
        value = answer_tokens[bad][0].item()
        raise ValueError(f"answer_tokens: token id {value} is out of range for d_vocab={d_vocab}")


def logits_to_ave_logit_diff(
    logits: Float[Tensor, "batch pos d_vocab"],
    answer_tokens: Int[Tensor, "batch 2"],
    per_prompt: bool = False,
) -> Float[Tensor, ""] | Float[Tensor, " batch"]:
    """Correct-answer logit minus wrong-answer logit at the last position, averaged over
    the batch (`per_prompt=True`: one value per prompt). ARENA's name and signature.

    Example:
        >>> logits_to_ave_logit_diff(logits, torch.tensor([[5, 7]]))   # logits[0, -1, 5] - logits[0, -1, 7]
    """
    _check_logits_and_answers(logits, answer_tokens)
    final = logits[:, -1, :]  # [batch, d_vocab]
    answer_logits = final.gather(-1, answer_tokens.to(final.device))  # [batch, 2]
    diff = answer_logits[:, 0] - answer_logits[:, 1]
    return diff if per_prompt else diff.mean()


def logit_diff(logits: Float[Tensor, "batch pos d_vocab"], answer_tokens: Int[Tensor, "batch 2"]) -> Float[Tensor, ""]:
    """The average logit difference (correct minus wrong, last position); a patching metric
    once the answers are bound: `metric = functools.partial(logit_diff, answer_tokens=answers)`."""
    return logits_to_ave_logit_diff(logits, answer_tokens)


def _as_logit_diff(value: float | Tensor, answer_tokens: Tensor, arg: str) -> float:
    if isinstance(value, Tensor) and value.ndim == 3:  # logits: compute their logit difference
        return float(logits_to_ave_logit_diff(value.detach(), answer_tokens))
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
    raise TypeError(f"{arg}: expected a logit difference (a number) or logits [batch, pos, d_vocab], got {got}")


def normalized_logit_diff(
    answer_tokens: Int[Tensor, "batch 2"],
    clean: float | Tensor,
    corrupted: float | Tensor,
) -> Metric:
    """A metric that is 0 on the corrupted run and 1 on the clean run:
    `metric(logits) = (ld - corrupted_ld) / (clean_ld - corrupted_ld)`, `ld` the average
    logit difference. `clean` / `corrupted` are either those runs' logits or their logit
    differences (numbers).

    Example:
        >>> metric = normalized_logit_diff(answers, clean_logits, corrupted_logits)
        >>> patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)
    """
    if not isinstance(answer_tokens, Tensor):
        raise TypeError(f"answer_tokens: expected an integer tensor [batch, 2], got {type(answer_tokens).__name__}")
    clean_ld = _as_logit_diff(clean, answer_tokens, "clean")
    corrupted_ld = _as_logit_diff(corrupted, answer_tokens, "corrupted")
    if clean_ld == corrupted_ld:
        raise ValueError(
            f"clean and corrupted have the same logit difference ({clean_ld:g}): "
            "the normalisation (ld - corrupted) / (clean - corrupted) is undefined"
        )

    def metric(logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, ""]:
        return (logits_to_ave_logit_diff(logits, answer_tokens) - corrupted_ld) / (clean_ld - corrupted_ld)

    metric.clean_logit_diff = clean_ld  # type: ignore[attr-defined]
    metric.corrupted_logit_diff = corrupted_ld  # type: ignore[attr-defined]
    return metric


__all__ = ["logit_diff", "logits_to_ave_logit_diff", "normalized_logit_diff", "Metric"]
