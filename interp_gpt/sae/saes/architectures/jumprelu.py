"""The JumpReLU SAE (sae-lens' JumpReLUSAE): a feature fires only above its learned threshold.

    h = (x - b_dec) @ W_enc + b_enc
    f = ReLU(h) * (h > threshold)

Example:
    >>> SAE(SAEConfig(d_in=64, d_sae=256, architecture="jumprelu",
    ...               metadata={"hook_name": "blocks.1.hook_resid_pre"}))
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import Architecture

__all__ = ["JumpReLU"]


class JumpReLU(Architecture):
    """ReLU gated by a per-feature threshold (sae-lens' "jumprelu"); inference here."""

    name: ClassVar[str] = "jumprelu"
    trainable: ClassVar[bool] = False

    def shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]:
        return {**super().shapes(cfg), "threshold": (cfg.d_sae,)}

    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        threshold = sae.threshold.to(hidden_pre.dtype)
        return torch.relu(hidden_pre) * (hidden_pre > threshold).to(hidden_pre.dtype)
