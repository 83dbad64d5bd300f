"""The TopK SAE (sae-lens' TopKSAE): the k largest pre-activations of each token, ReLU'd.

    h = (x - b_dec) @ W_enc + b_enc          (times ||W_dec[i]|| with rescale_acts_by_decoder_norm)
    f = ReLU(h) on the k largest entries of h, 0 elsewhere

Training (sae-lens' TopKTrainingSAE): MSE plus the AuxK loss, in which the `k_aux = d_in // 2`
largest pre-activations of the dead features reconstruct the residual the live ones leave:
`aux_coefficient * min(n_dead / k_aux, 1) * ||(x - x_hat) - W_dec^T topk_aux(h_dead)||^2`.

Example:
    >>> SAE(SAEConfig(d_in=64, d_sae=256, architecture="topk", k=8,
    ...               metadata={"hook_name": "blocks.1.hook_resid_pre"}))
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Architecture, decoder_norms, mse_of

__all__ = ["TopK", "aux_k_loss"]


class TopK(Architecture):
    """k features per token (sae-lens' "topk")."""

    name: ClassVar[str] = "topk"
    fields: ClassVar[dict[str, Any]] = {"k": 100, "rescale_acts_by_decoder_norm": False}  # sae-lens' defaults
    loss_names: ClassVar[tuple[str, ...]] = ("aux",)
    unit_norm_decoder: ClassVar[bool] = True  # the trainer's default for normalize_decoder

    def check_config(self, cfg: Any) -> None:
        if not isinstance(cfg.k, int) or isinstance(cfg.k, bool) or not 1 <= cfg.k <= cfg.d_sae:
            raise ValueError(f"k={cfg.k!r}: expected an integer in 1..d_sae={cfg.d_sae}")

    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        if sae.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * decoder_norms(sae)
        values, indices = torch.topk(hidden_pre, k=sae.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(hidden_pre).scatter_(-1, indices, values.relu())

    def decode(self, sae: Any, feature_acts: Tensor) -> Tensor:
        if sae.cfg.rescale_acts_by_decoder_norm:
            feature_acts = feature_acts * (1 / decoder_norms(sae))
        return feature_acts @ sae.W_dec + sae.b_dec

    def check_trainable(self, sae: Any, trainer: Any) -> None:
        if sae.cfg.rescale_acts_by_decoder_norm:
            raise ValueError("sae: train TopK with rescale_acts_by_decoder_norm=False (the decoder is kept unit-norm)")

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """b_dec folds into the encoder bias (`(x - b_dec) @ W_enc = x @ W_enc - b_dec @ W_enc`: no
        `[n, d_in]` input gradient); the decoder sums the k chosen rows per token (`embedding_bag`:
        k / d_sae of the dense matmul's work, forward and backward)."""
        sae = trainer.sae
        bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc
        hidden_pre = torch.addmm(bias, x, sae.W_enc)
        values, indices = torch.topk(hidden_pre, k=sae.cfg.k, dim=-1, sorted=False)
        acts = values.relu()
        x_hat = F.embedding_bag(indices, sae.W_dec, per_sample_weights=acts, mode="sum") + sae.b_dec
        with torch.no_grad():
            feats = torch.zeros_like(hidden_pre).scatter_(-1, indices, acts)
            fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=x.device)
            fired[indices[acts > 0]] = True
        mse = mse_of(x_hat, x)
        parts = {"mse": mse, "feats": feats, "fired": fired}
        aux = aux_k_loss(trainer, x, x_hat, hidden_pre)
        if aux is not None:
            parts["aux"] = aux
            return mse + aux, parts
        return mse, parts


def aux_k_loss(trainer: Any, x: Tensor, x_hat: Tensor, hidden_pre: Tensor) -> Tensor | None:
    """TopK's AuxK loss (None while no feature is dead): the `k_aux = max(1, d_in // 2)` largest
    pre-activations among the dead features reconstruct the residual `x - x_hat` (detached)."""
    dead = trainer.dead_mask()
    n_dead = int(dead.sum())
    if not n_dead:
        return None
    sae = trainer.sae
    k_aux = max(1, sae.cfg.d_in // 2)  # sae-lens' d_in // 2, at least one (d_in = 1)
    scale = min(n_dead / k_aux, 1.0)
    masked = torch.where(dead[None], hidden_pre, -torch.inf)
    aux_values, aux_indices = masked.topk(min(k_aux, n_dead), dim=-1, sorted=False)
    aux_hat = F.embedding_bag(aux_indices, sae.W_dec, per_sample_weights=aux_values, mode="sum")
    residual = (x - x_hat).detach()
    return trainer.cfg.aux_coefficient * scale * (aux_hat - residual).pow(2).sum(-1).mean()
