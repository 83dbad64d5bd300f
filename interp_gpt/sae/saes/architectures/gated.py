"""The Gated SAE (sae-lens' GatedSAE / GatedTrainingSAE; Rajamanoharan et al. 2024): one encoder
decides which features fire, a rescaled copy of it how strongly.

    pi = (x - b_dec) @ W_enc                                    # [..., d_sae]
    f = (pi + b_gate > 0) * ReLU(pi * exp(r_mag) + b_mag)       # the gate; the magnitude (hook_sae_acts_pre)
    x_hat = f @ W_dec + b_dec

It holds b_gate, b_mag and r_mag in place of b_enc (sae-lens' names). The gate has no gradient, so
training adds two terms on its pre-activation: `loss = ||x_hat - x||^2 + l1_coefficient * sum_i
ReLU(pi + b_gate)_i * ||W_dec[i]||` (warmed up over `l1_warm_up_steps`) `+ ||ReLU(pi + b_gate) @ W_dec
+ b_dec - x||^2` (the gate's own reconstruction, "aux"), each averaged over rows. `init_weights`
starts as sae-lens' trainer does: decoder rows of norm 0.1, the encoder their transpose, the three
biases and r_mag 0 (b_dec: the first batch's mean with `init_b_dec_to_mean`, sae-lens' 0 without).

Speed: `pi` is one matmul for both paths (sae-lens runs the encoder three times a step), and once
the gate is sparse both decodes and their backward run on the open positions only (`Support`).

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="gated",
    ...                     metadata={"hook_name": "blocks.1.hook_resid_pre"}))
    >>> sae.encode(torch.randn(2, 64)).shape
    torch.Size([2, 256])
    >>> SAETrainer(sae, SAETrainingConfig(l1_coefficient=2.0)).train(batches, 500)
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import Architecture, decoder_norms, folded_bias, mse_of
from .sparse import Support, sparse_enough

__all__ = ["Gated"]


class Gated(Architecture):
    """A gate and a magnitude from one encoder (sae-lens' "gated")."""

    name: ClassVar[str] = "gated"

    def shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]:
        return {
            "W_enc": (cfg.d_in, cfg.d_sae),
            "W_dec": (cfg.d_sae, cfg.d_in),
            "b_gate": (cfg.d_sae,),
            "b_mag": (cfg.d_sae,),
            "r_mag": (cfg.d_sae,),
            "b_dec": (cfg.d_in,),
        }

    def encode(self, sae: Any, x: Tensor, hp: dict[str, Any]) -> Tensor:
        pi = (x - sae.b_dec * sae.cfg.apply_b_dec_to_input) @ sae.W_enc  # shared by both paths
        gate = (pi + sae.b_gate > 0).to(pi.dtype)
        magnitude_pre = hp["hook_sae_acts_pre"](pi * sae.r_mag.exp() + sae.b_mag)
        return gate * torch.relu(magnitude_pre)

    # ----- training -----------------------------------------------------------------------
    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """MSE, "l1" (the gate's decoder-norm-weighted L1) and "aux" (the gate's reconstruction)."""
        sae = trainer.sae
        bias = folded_bias(sae, torch.zeros_like(sae.b_gate))  # (x - b_dec) @ W_enc as one addmm on x
        pi = torch.addmm(bias, x, sae.W_enc)
        gate_pre = pi + sae.b_gate  # [n, d_sae]
        norms = decoder_norms(sae)
        with torch.no_grad():
            open_ = gate_pre > 0
        if sparse_enough(open_):
            s = Support.of(open_)
            p, cols = s.encoder_entries(pi.detach(), x, sae.W_enc, bias), s.cols
            gate = torch.relu(p + sae.b_gate.index_select(0, cols))  # > 0 here: the relu keeps sae-lens' gradient
            magnitude = torch.relu(p * sae.r_mag.exp().index_select(0, cols) + sae.b_mag.index_select(0, cols))
            x_hat = s.decode(magnitude, sae.W_dec) + sae.b_dec
            via_gate = s.decode(gate, sae.W_dec) + sae.b_dec
            l1_per_row = s.row_sum(gate * norms.index_select(0, cols))
            feats, fired = s.dense(magnitude), s.fired(magnitude != 0)
        else:
            gate = torch.relu(gate_pre)
            magnitude = open_.to(pi.dtype) * torch.relu(pi * sae.r_mag.exp() + sae.b_mag)
            x_hat = torch.addmm(sae.b_dec, magnitude, sae.W_dec)
            via_gate = torch.addmm(sae.b_dec, gate, sae.W_dec)
            l1_per_row = (gate * norms).sum(-1)
            feats = magnitude.detach()
            fired = (feats != 0).any(0)
        c = trainer.cfg
        mse = mse_of(x_hat, x)
        l1 = trainer.coefficient(c.l1_coefficient, c.l1_warm_up_steps) * l1_per_row.mean()
        aux = mse_of(via_gate, x)
        parts = {"mse": mse, "l1": l1, "aux": aux, "feats": feats, "x_hat": x_hat.detach(), "fired": fired}
        return mse + l1 + aux, parts
