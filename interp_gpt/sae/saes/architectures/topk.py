"""The TopK SAE (sae-lens' TopKSAE): the k largest pre-activations of each token, ReLU'd.

    h = (x - b_dec) @ W_enc + b_enc          (times ||W_dec[i]|| with rescale_acts_by_decoder_norm)
    f = ReLU(h) on the k largest entries of h, 0 elsewhere
    x_hat = f @ W_dec + b_dec                (f / ||W_dec[i]|| with rescale_acts_by_decoder_norm)

Training (sae-lens' TopKTrainingSAE): MSE plus the AuxK loss, in which the `k_aux = d_in // 2`
largest pre-activations of the dead features reconstruct the residual the live ones leave:
`aux_coefficient * min(n_dead / k_aux, 1) * ||(x - x_hat) - W_dec^T topk_aux(h_dead)||^2`.
Two forms: ours by default (rescale_acts_by_decoder_norm=False, the decoder rows kept at unit norm by
the trainer), and sae-lens' training default (rescale_acts_by_decoder_norm=True, a free decoder:
`normalize_decoder=True` is refused with it). `SAE.save_model` folds the decoder norms into the
encoder as sae-lens' `save_inference_model` does (same outputs, unit-norm decoder rows).

Example:
    >>> SAE(SAEConfig(d_in=64, d_sae=256, architecture="topk", k=8,
    ...               metadata={"hook_name": "blocks.1.hook_resid_pre"}))
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ...common import check_positive_ints
from .base import Architecture, decoder_norms, mse_of

__all__ = ["TopK", "aux_k_loss", "dead_reconstruction_loss", "training_pre_acts", "folded_norms_state"]


class TopK(Architecture):
    """k features per token (sae-lens' "topk")."""

    name: ClassVar[str] = "topk"
    fields: ClassVar[dict[str, Any]] = {"k": 100, "rescale_acts_by_decoder_norm": False}  # sae-lens' defaults
    loss_names: ClassVar[tuple[str, ...]] = ("aux",)
    unit_norm_decoder: ClassVar[bool] = True  # the trainer's default for normalize_decoder (rescale off)

    def check_config(self, cfg: Any) -> None:
        check_positive_ints(cfg, ("k",))
        if not 1 <= cfg.k <= cfg.d_sae:
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

    # ----- training -----------------------------------------------------------------------
    def unit_norm_decoder_default(self, cfg: Any) -> bool:
        """Unit-norm rows by default, unless the activations are rescaled by them (sae-lens' form)."""
        return not cfg.rescale_acts_by_decoder_norm

    def check_trainable(self, sae: Any, trainer: Any) -> None:
        if sae.cfg.rescale_acts_by_decoder_norm and trainer.cfg.normalize_decoder:
            raise ValueError(
                f"normalize_decoder=True with sae.cfg.rescale_acts_by_decoder_norm=True: a {self.name} SAE that "
                "rescales its activations by the decoder norms trains with a free decoder (as sae-lens does); "
                "set normalize_decoder=False (or None), or rescale_acts_by_decoder_norm=False for unit-norm rows"
            )

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The decoder sums the k chosen rows per token (`embedding_bag`: k / d_sae of the dense
        matmul's work, forward and backward); see `training_pre_acts` for the encoder."""
        sae = trainer.sae
        hidden_pre, inv_norm = training_pre_acts(sae, x)
        values, indices = torch.topk(hidden_pre, k=sae.cfg.k, dim=-1, sorted=False)
        acts = values.relu()
        weights = acts if inv_norm is None else acts * inv_norm[indices]
        x_hat = F.embedding_bag(indices, sae.W_dec, per_sample_weights=weights, mode="sum") + sae.b_dec
        with torch.no_grad():
            feats = torch.zeros_like(hidden_pre).scatter_(-1, indices, acts)
            fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=x.device)
            fired[indices[acts > 0]] = True
        mse = mse_of(x_hat, x)
        parts = {"mse": mse, "feats": feats, "fired": fired, "x_hat": x_hat.detach()}
        aux = aux_k_loss(trainer, x, x_hat, hidden_pre, inv_norm)
        if aux is not None:
            parts["aux"] = aux
            return mse + aux, parts
        return mse, parts

    def inference_state(self, sae: Any, state: dict[str, Tensor]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """With rescale_acts_by_decoder_norm: the decoder norms folded into W_enc and b_enc (sae-lens'
        TopKTrainingSAE.process_state_dict_for_saving_inference); the config is unchanged."""
        return {}, folded_norms_state(sae, state)


def folded_norms_state(sae: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """`state` with `n = ||W_dec[i]||` (at least 1e-8) folded in where the SAE rescales by it: W_enc * n,
    b_enc * n, W_dec / n (the same function, unit-norm decoder rows); `state` as it is otherwise."""
    if not sae.cfg.rescale_acts_by_decoder_norm:
        return state
    norms = sae.W_dec.detach().norm(dim=-1).clamp(min=1e-8)
    return {
        **state,
        "W_enc": state["W_enc"] * norms[None],
        "b_enc": state["b_enc"] * norms,
        "W_dec": state["W_dec"] / norms[:, None],
    }


def training_pre_acts(sae: Any, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """The pre-activations `[n, d_sae]` the topk family ranks, and `1 / ||W_dec[i]||` where the SAE
    rescales by the decoder norms (None otherwise). b_dec folds into the encoder bias
    (`(x - b_dec) @ W_enc = x @ W_enc - b_dec @ W_enc`: no `[n, d_in]` input gradient) and the norms into
    the encoder's columns (`[d_in, d_sae]` work, not `[n, d_sae]`)."""
    bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc
    if not sae.cfg.rescale_acts_by_decoder_norm:
        return torch.addmm(bias, x, sae.W_enc), None
    norms = decoder_norms(sae)
    return torch.addmm(bias * norms, x, sae.W_enc * norms), 1 / norms


def aux_k_loss(
    trainer: Any, x: Tensor, x_hat: Tensor, hidden_pre: Tensor, inv_norm: Tensor | None = None
) -> Tensor | None:
    """TopK's AuxK loss (None while no feature is dead): the `k_aux = max(1, d_in // 2)` largest
    pre-activations among the dead features reconstruct the residual `x - x_hat` (detached), scaled by
    `aux_coefficient * min(n_dead / k_aux, 1)`."""
    dead = trainer.dead_mask()
    n_dead = int(dead.sum())
    if not n_dead:
        return None
    sae = trainer.sae
    k_aux = max(1, sae.cfg.d_in // 2)  # sae-lens' d_in // 2, at least one (d_in = 1)
    scale = min(n_dead / k_aux, 1.0)
    dead_features = dead.nonzero().squeeze(1)
    loss = dead_reconstruction_loss(
        sae.W_dec, hidden_pre, (x - x_hat).detach(), dead_features, min(k_aux, n_dead), inv_norm
    )
    return trainer.cfg.aux_coefficient * scale * loss  # type: ignore[no-any-return]


def dead_reconstruction_loss(
    W_dec: Tensor, hidden_pre: Tensor, residual: Tensor, dead_features: Tensor, k_aux: int, inv_norm: Tensor | None
) -> Tensor:
    """`||residual - sum_j h_j W_dec[j]||^2` (summed over d_in, mean over rows) over the `k_aux` largest
    pre-activations `h_j` (not ReLU'd, as sae-lens) among `dead_features` (indices) in each row; with
    `inv_norm`, `h_j / ||W_dec[j]||`. Only the dead columns are ranked: `[n, n_dead]` work."""
    values, j = hidden_pre.index_select(1, dead_features).topk(k_aux, dim=-1, sorted=False)
    indices = dead_features[j]
    weights = values if inv_norm is None else values * inv_norm[indices]
    aux_hat = F.embedding_bag(indices, W_dec, per_sample_weights=weights, mode="sum")
    return (aux_hat - residual).pow(2).sum(-1).mean()
