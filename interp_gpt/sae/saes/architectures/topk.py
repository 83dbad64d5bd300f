"""The TopK SAE (sae-lens' TopKSAE): the k largest pre-activations of each token, ReLU'd.

    h = (x - b_dec) @ W_enc + b_enc          (times ||W_dec[i]|| with rescale_acts_by_decoder_norm)
    f = ReLU(h) on the k largest entries of h, 0 elsewhere

Training (sae-lens' TopKTrainingSAE): MSE plus the AuxK loss, in which the `k_aux = d_in // 2`
largest pre-activations of the dead features reconstruct the residual the live ones leave:
`aux_coefficient * min(n_dead / k_aux, 1) * ||(x - x_hat) - W_dec^T topk_aux(h_dead)||^2`.

The selection is one method (`select`, and `select_dead` for AuxK): AbsTopK (abstopk.py) changes only
those and shares the rest, the training path included.

Example:
    >>> SAE(SAEConfig(d_in=64, d_sae=256, architecture="topk", k=8,
    ...               metadata={"hook_name": "blocks.1.hook_resid_pre"}))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Architecture, decoder_norms, mse_of

__all__ = ["TopK", "aux_k_loss", "largest_dead", "sum_rows"]

# (hidden_pre [n, d_sae], dead [d_sae], k_aux) -> (values, indices) [n, k_aux]: AuxK's choice of dead features
DeadSelection = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]


class TopK(Architecture):
    """k features per token (sae-lens' "topk")."""

    name: ClassVar[str] = "topk"
    fields: ClassVar[dict[str, Any]] = {"k": 100, "rescale_acts_by_decoder_norm": False}  # sae-lens' defaults
    loss_names: ClassVar[tuple[str, ...]] = ("aux",)
    unit_norm_decoder: ClassVar[bool] = True  # the trainer's default for normalize_decoder

    def check_config(self, cfg: Any) -> None:
        if not isinstance(cfg.k, int) or isinstance(cfg.k, bool) or not 1 <= cfg.k <= cfg.d_sae:
            raise ValueError(f"k={cfg.k!r}: expected an integer in 1..d_sae={cfg.d_sae}")

    # ----- the selection (what AbsTopK changes) -----------------------------------------
    def select(self, hidden_pre: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(values, indices) `[..., k]`: the features each row keeps and their activations (here the k
        largest pre-activations, ReLU'd)."""
        values, indices = torch.topk(hidden_pre, k=k, dim=-1, sorted=False)
        return values.relu(), indices

    def select_dead(self, hidden_pre: Tensor, dead: Tensor, k_aux: int) -> tuple[Tensor, Tensor]:
        """AuxK's (values, indices) `[n, k_aux]` among the dead features (`k_aux <= n_dead`)."""
        return largest_dead(hidden_pre, dead, k_aux)

    # ----- inference ----------------------------------------------------------------------
    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        if sae.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * decoder_norms(sae)
        values, indices = self.select(hidden_pre, sae.cfg.k)
        return torch.zeros_like(hidden_pre).scatter_(-1, indices, values)

    def decode(self, sae: Any, feature_acts: Tensor) -> Tensor:
        if sae.cfg.rescale_acts_by_decoder_norm:
            feature_acts = feature_acts * (1 / decoder_norms(sae))
        return feature_acts @ sae.W_dec + sae.b_dec

    # ----- training -----------------------------------------------------------------------
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
        inv_norms = None
        if sae.cfg.rescale_acts_by_decoder_norm:  # rank by acts * |W_dec[i]|, decode acts / |W_dec[i]|
            norms = decoder_norms(sae)
            hidden_pre, inv_norms = hidden_pre * norms, 1 / norms
        values, indices = self.select(hidden_pre, sae.cfg.k)
        x_hat = sum_rows(sae.W_dec, indices, values, inv_norms) + sae.b_dec
        with torch.no_grad():
            feats = torch.zeros_like(hidden_pre).scatter_(-1, indices, values)
            fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=x.device)
            fired[indices[values != 0]] = True  # a feature fires when its activation is non-zero (either sign)
        mse = mse_of(x_hat, x)
        parts = {"mse": mse, "feats": feats, "fired": fired, "x_hat": x_hat.detach()}
        aux = aux_k_loss(trainer, x, x_hat, hidden_pre, select_dead=self.select_dead, inv_norms=inv_norms)
        if aux is not None:
            parts["aux"] = aux
            return mse + aux, parts
        return mse, parts

    def inference_state(self, sae: Any, state: dict[str, Tensor]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """With rescale_acts_by_decoder_norm, sae-lens folds the decoder norms into the saved weights
        (unit decoder rows, `W_enc` and `b_enc` times the norms): the same features, any decoder."""
        if not sae.cfg.rescale_acts_by_decoder_norm:
            return {}, state
        norms = state["W_dec"].norm(dim=-1).clamp(min=1e-8)  # sae-lens' get_W_dec_norm
        folded = {
            **state,
            "W_dec": state["W_dec"] / norms[:, None],
            "W_enc": state["W_enc"] * norms,
            "b_enc": state["b_enc"] * norms,
        }
        return {}, folded


def sum_rows(W_dec: Tensor, indices: Tensor, values: Tensor, inv_norms: Tensor | None = None) -> Tensor:
    """`sum_j values[:, j] * W_dec[indices[:, j]]` `[n, d_in]` (times `inv_norms` of each row when given),
    without the dense `[n, d_sae]` product."""
    weights = values * inv_norms[indices] if inv_norms is not None else values
    return F.embedding_bag(indices, W_dec, per_sample_weights=weights, mode="sum")


def largest_dead(hidden_pre: Tensor, dead: Tensor, k_aux: int) -> tuple[Tensor, Tensor]:
    """TopK's AuxK choice: the `k_aux` largest pre-activations among the dead features, as they are."""
    masked = torch.where(dead[None], hidden_pre, -torch.inf)
    values, indices = masked.topk(k_aux, dim=-1, sorted=False)
    return values, indices


def aux_k_loss(
    trainer: Any,
    x: Tensor,
    x_hat: Tensor,
    hidden_pre: Tensor,
    *,
    select_dead: DeadSelection = largest_dead,
    inv_norms: Tensor | None = None,
) -> Tensor | None:
    """TopK's AuxK loss (None while no feature is dead): the `k_aux = max(1, d_in // 2)` dead features
    `select_dead` picks (by default the largest pre-activations) reconstruct the residual `x - x_hat`
    (detached). `inv_norms`: decode them divided by their decoder norms (rescale_acts_by_decoder_norm)."""
    dead = trainer.dead_mask()
    n_dead = int(dead.sum())
    if not n_dead:
        return None
    sae = trainer.sae
    k_aux = max(1, sae.cfg.d_in // 2)  # sae-lens' d_in // 2, at least one (d_in = 1)
    scale = min(n_dead / k_aux, 1.0)
    aux_values, aux_indices = select_dead(hidden_pre, dead, min(k_aux, n_dead))
    aux_hat = sum_rows(sae.W_dec, aux_indices, aux_values, inv_norms)
    residual = (x - x_hat).detach()
    return trainer.cfg.aux_coefficient * scale * (aux_hat - residual).pow(2).sum(-1).mean()
