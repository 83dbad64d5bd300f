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

The choice is two methods (`choose`, `act`, and AuxK's ranking of dead features): AbsTopK (abstopk.py)
changes them through `by_magnitude` and shares the rest, the training path included.

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
from .base import Architecture, decoder_norms, folded_bias, mse_of
from .sparse import encoder_entries

__all__ = ["TopK", "PreActs", "aux_k_loss", "dead_reconstruction_loss", "folded_norms_state"]


class TopK(Architecture):
    """k features per token (sae-lens' "topk")."""

    name: ClassVar[str] = "topk"
    fields: ClassVar[dict[str, Any]] = {"k": 100, "rescale_acts_by_decoder_norm": False}  # sae-lens' defaults
    unit_norm_decoder: ClassVar[bool] = True  # the trainer's default for normalize_decoder (rescale off)
    by_magnitude: ClassVar[bool] = False  # AbsTopK: rank by |h| and keep the sign (abstopk.py)

    def check_config(self, cfg: Any) -> None:
        check_positive_ints(cfg, ("k",))
        if not 1 <= cfg.k <= cfg.d_sae:
            raise ValueError(f"k={cfg.k!r}: expected an integer in 1..d_sae={cfg.d_sae}")

    # ----- the selection (what AbsTopK changes, through `by_magnitude`) ------------------------
    def choose(self, h: Tensor, k: int) -> Tensor:
        """The indices `[..., k]` each row keeps: its k largest pre-activations (largest |h| by magnitude)."""
        return (h.abs() if self.by_magnitude else h).topk(k, dim=-1, sorted=False).indices

    def act(self, values: Tensor) -> Tensor:
        """The kept pre-activations' activations: ReLU'd (signed, as they are, by magnitude)."""
        return values if self.by_magnitude else values.relu()

    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        if sae.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * decoder_norms(sae)
        indices = self.choose(hidden_pre, sae.cfg.k)
        return torch.zeros_like(hidden_pre).scatter_(-1, indices, self.act(hidden_pre.gather(-1, indices)))

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
        matmul's work, forward and backward); the encoder's backward reaches only the chosen
        pre-activations (see `PreActs`)."""
        sae = trainer.sae
        n, k = x.shape[0], sae.cfg.k
        pre = PreActs(sae, x)
        indices = self.choose(pre.h, k)
        rows = torch.arange(n, device=x.device).repeat_interleave(k)
        acts = self.act(pre.at(rows, indices.flatten()).view(n, k))
        weights = acts if pre.inv_norm is None else acts * pre.inv_norm[indices]
        x_hat = F.embedding_bag(indices, sae.W_dec, per_sample_weights=weights, mode="sum") + sae.b_dec
        with torch.no_grad():
            feats = torch.zeros_like(pre.h).scatter_(-1, indices, acts)
            fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=x.device)
            fired[indices[acts != 0]] = True  # a feature fires when its activation is non-zero (either sign)
        mse = mse_of(x_hat, x)
        parts = {"mse": mse, "feats": feats, "fired": fired, "x_hat": x_hat.detach()}
        aux = aux_k_loss(trainer, x, x_hat, pre, self.by_magnitude)
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


class PreActs:
    """The pre-activations `h` `[n, d_sae]` the topk family ranks, computed once outside autograd, and
    `at(rows, features)`: the chosen ones, differentiable. b_dec folds into the encoder bias
    (`(x - b_dec) @ W_enc = x @ W_enc - b_dec @ W_enc`: no `[n, d_in]` input gradient) and, where the SAE
    rescales by the decoder norms, the norms into the encoder's columns (`[d_in, d_sae]` work, not
    `[n, d_sae]`); `inv_norm` is then `1 / ||W_dec[i]||` (None otherwise). The encoder's backward is
    sparse (`sparse.encoder_entries`): `nnz * d_in` work for the chosen entries, not a dense `[n, d_sae]`
    gradient and matmul."""

    def __init__(self, sae: Any, x: Tensor) -> None:
        bias = folded_bias(sae)
        weight, self.inv_norm = sae.W_enc, None
        if sae.cfg.rescale_acts_by_decoder_norm:
            norms = decoder_norms(sae)
            weight, bias, self.inv_norm = weight * norms, bias * norms, 1 / norms
        self.x, self.weight, self.bias = x, weight, bias
        with torch.no_grad():
            self.h = torch.addmm(bias, x, weight)

    def at(self, rows: Tensor, features: Tensor) -> Tensor:
        """`h[rows, features]` `[nnz]`, its gradient flowing to the encoder's weight and bias."""
        return encoder_entries(self.h, self.x, self.weight, self.bias, rows, features)


def aux_k_loss(trainer: Any, x: Tensor, x_hat: Tensor, pre: PreActs, by_magnitude: bool = False) -> Tensor | None:
    """TopK's AuxK loss (None while no feature is dead): the `k_aux = max(1, d_in // 2)` largest
    pre-activations among the dead features (by |h|, signed, `by_magnitude`: AbsTopK's, sae-lens'
    calculate_abstopk_aux_acts) reconstruct the residual `x - x_hat` (detached), scaled by
    `aux_coefficient * min(n_dead / k_aux, 1)`."""
    dead = trainer.dead_mask()
    n_dead = int(dead.sum())
    if not n_dead:
        return None
    sae = trainer.sae
    k_aux = max(1, sae.cfg.d_in // 2)  # sae-lens' d_in // 2, at least one (d_in = 1)
    scale = min(n_dead / k_aux, 1.0)
    dead_features = dead.nonzero().squeeze(1)
    residual = (x - x_hat).detach()
    loss = dead_reconstruction_loss(sae.W_dec, pre, residual, dead_features, min(k_aux, n_dead), by_magnitude)
    return trainer.cfg.aux_coefficient * scale * loss  # type: ignore[no-any-return]


def dead_reconstruction_loss(
    W_dec: Tensor, pre: PreActs, residual: Tensor, dead_features: Tensor, k_aux: int, by_magnitude: bool = False
) -> Tensor:
    """`||residual - sum_j h_j W_dec[j]||^2` (summed over d_in, mean over rows) over the `k_aux` largest
    pre-activations `h_j` (not ReLU'd, as sae-lens) among `dead_features` (indices) in each row; where
    the SAE rescales, `h_j / ||W_dec[j]||`. Only the dead columns are ranked: `[n, n_dead]` work."""
    n = pre.h.shape[0]
    h_dead = pre.h.index_select(1, dead_features)
    indices = dead_features[(h_dead.abs() if by_magnitude else h_dead).topk(k_aux, dim=-1, sorted=False).indices]
    rows = torch.arange(n, device=indices.device).repeat_interleave(k_aux)
    values = pre.at(rows, indices.flatten()).view(n, k_aux)
    weights = values if pre.inv_norm is None else values * pre.inv_norm[indices]
    aux_hat = F.embedding_bag(indices, W_dec, per_sample_weights=weights, mode="sum")
    return (aux_hat - residual).pow(2).sum(-1).mean()
