"""The standard SAE: ReLU features, an L1 penalty weighted by the decoder rows' norms (sae-lens'
StandardSAE / StandardTrainingSAE).

    f = ReLU((x - b_dec) @ W_enc + b_enc)
    loss = ||x_hat - x||^2 + l1_coefficient * sum_i f_i * ||W_dec[i]||

The coefficient warms up linearly over `l1_warm_up_steps` (rescaling a decoder row cannot shrink
the penalty, so the decoder is left free).

Example:
    >>> SAE(SAEConfig(d_in=64, d_sae=256, metadata={"hook_name": "blocks.1.hook_resid_pre"}))
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import Architecture, decoder_norms, mse_of

__all__ = ["Standard"]


class Standard(Architecture):
    """ReLU features, decoder-norm-weighted L1 (sae-lens' "standard")."""

    name: ClassVar[str] = "standard"
    loss_names: ClassVar[tuple[str, ...]] = ("l1",)

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        sae = trainer.sae
        sae_in = x - sae.b_dec * sae.cfg.apply_b_dec_to_input
        feats = torch.relu(torch.addmm(sae.b_enc, sae_in, sae.W_enc))  # one pass: sae_in @ W_enc + b_enc
        x_hat = torch.addmm(sae.b_dec, feats, sae.W_dec)
        mse = mse_of(x_hat, x)
        coeff = trainer.coefficient(trainer.cfg.l1_coefficient, trainer.cfg.l1_warm_up_steps)
        l1 = coeff * (feats * decoder_norms(sae)).sum(-1).mean()
        return mse + l1, {"mse": mse, "l1": l1, "feats": feats.detach()}
