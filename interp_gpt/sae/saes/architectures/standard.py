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

from .base import Architecture, decoder_norms, folded_bias, mse_of
from .sparse import Support, sparse_enough

__all__ = ["Standard"]


class Standard(Architecture):
    """ReLU features, decoder-norm-weighted L1 (sae-lens' "standard")."""

    name: ClassVar[str] = "standard"

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """sae-lens' terms, with b_dec folded into the encoder bias and, once few features fire (a
        trained SAE's regime), the encoder's gradient and the decode through the active entries alone
        (`Support`): equal values up to float summation order, less work."""
        sae = trainer.sae
        coeff = trainer.coefficient(trainer.cfg.l1_coefficient, trainer.cfg.l1_warm_up_steps)
        norms = decoder_norms(sae)
        bias = folded_bias(sae)
        hidden_pre = torch.addmm(bias, x, sae.W_enc)
        active = hidden_pre.detach() > 0
        if sparse_enough(active):  # hidden_pre's graph is left unused: the gradient goes through the support
            s = Support.of(active)
            values = s.encoder_entries(hidden_pre.detach(), x, sae.W_enc, bias)  # > 0: ReLU'd already
            x_hat = s.decode(values, sae.W_dec) + sae.b_dec
            l1 = coeff * (values * norms.index_select(0, s.cols)).sum() / x.shape[0]
            feats = s.dense(values)
        else:
            feats = torch.relu(hidden_pre)
            x_hat = torch.addmm(sae.b_dec, feats, sae.W_dec)
            l1 = coeff * (feats * norms).sum() / x.shape[0]
            feats = feats.detach()
        mse = mse_of(x_hat, x)
        return mse + l1, {"mse": mse, "l1": l1, "feats": feats, "x_hat": x_hat.detach()}
