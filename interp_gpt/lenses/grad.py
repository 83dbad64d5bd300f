"""What the lenses that train or differentiate (`fit_tuned_lens`, `jacobian_lens`) need of autograd.

Both run their own gradients: they leave a caller's `torch.no_grad()` and `torch.inference_mode()` for the
fit (`torch.enable_grad()`, `torch.inference_mode(False)`), as a caller of `fit_tuned_lens` under either
expects the lens trained. What they cannot leave is a weight made under inference mode (an inference
tensor): no gradient passes through it, so it is refused by name before any work (`check_not_inference`).
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

__all__ = ["check_not_inference"]


def check_not_inference(tensors: Iterable[tuple[str, Tensor]], arg: str, caller: str) -> None:
    """Refuse `arg` if any of its named tensors is an inference tensor (made under `torch.inference_mode()`):
    autograd cannot save one for backward, so a fit through it would fail at its first step.

    Example:
        >>> check_not_inference(model.named_parameters(), "model", "fit_tuned_lens")     # made outside: fine
        >>> with torch.inference_mode():
        ...     w = torch.zeros(2)
        >>> check_not_inference([("w", w)], "model", "fit_tuned_lens")
        Traceback (most recent call last):
        ...
        ValueError: fit_tuned_lens: model's w was made under torch.inference_mode() ...
    """
    for name, t in tensors:
        if t.is_inference():
            raise ValueError(
                f"{caller}: {arg}'s {name} was made under torch.inference_mode() (an inference tensor), and no "
                f"gradient can pass through one; make {arg} outside inference mode ({caller} itself leaves "
                "inference mode for its fit)"
            )
