"""The Matryoshka BatchTopK SAE (sae-lens' MatryoshkaBatchTopKTrainingSAE; Bussmann et al. 2025,
https://arxiv.org/abs/2503.17547): a BatchTopK SAE whose first features must reconstruct on their own.

With nested widths `w_1 < w_2 < ... < w_L = d_sae` (`matryoshka_widths`) and the BatchTopK features f,
each prefix decodes on its own, `x_hat_l = f[:w_l] @ W_dec[:w_l] + b_dec` (f / ||W_dec[i]|| with
rescale_acts_by_decoder_norm), and the loss sums their reconstruction errors:

    loss = ||x_hat_L - x||^2 + aux + sum_{l < L} ||x_hat_l - x||^2     (each summed over d_in, mean over rows)

logged as "mse" (the whole SAE), "aux" and "inner_mse_{w_l}" (sae-lens' mse_loss,
auxiliary_reconstruction_loss, inner_mse_loss_{w_l}). `aux` is TopK's AuxK loss, or with the trainer's
`use_matryoshka_aux_loss` one per level: the dead features of level l reconstruct `x - x_hat_l`, each
scaled by `min(n_dead_l / k_aux, 1)`, summed, times aux_coefficient. The running threshold and the
inference form are BatchTopK's: `SAE.save_model` writes a "jumprelu" SAE.

Widths as sae-lens' _validate_matryoshka_config takes them: positive, strictly increasing; a last width
below d_sae gets d_sae appended (with sae-lens' warning), and a width above d_sae is refused.

Speed: the kept activations are decoded once, one `embedding_bag` over (row, level) bags, and the
prefixes are a cumulative sum over the levels (`[n, L, d_in]`), not L dense decodes.

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="matryoshka_batchtopk", k=8,
    ...                     matryoshka_widths=[16, 64, 256], metadata={"hook_name": "blocks.1.hook_resid_pre"}))
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import mse_of
from .batchtopk import BatchTopK
from .topk import PreActs, aux_k_loss, dead_reconstruction_loss

__all__ = ["MatryoshkaBatchTopK"]


class MatryoshkaBatchTopK(BatchTopK):
    """BatchTopK with nested reconstruction losses (sae-lens' "matryoshka_batchtopk"); saved as "jumprelu"."""

    name: ClassVar[str] = "matryoshka_batchtopk"
    fields: ClassVar[dict[str, Any]] = {**BatchTopK.fields, "matryoshka_widths": []}  # sae-lens' defaults

    def check_config(self, cfg: Any) -> None:
        super().check_config(cfg)
        widths = cfg.matryoshka_widths
        said = f"matryoshka_widths={widths!r}"
        if not isinstance(widths, (list, tuple)) or not widths:
            raise ValueError(
                f"{said}: expected a non-empty list of nested widths, e.g. [{cfg.d_sae // 4}, {cfg.d_sae}]"
            )
        bad = [w for w in widths if isinstance(w, bool) or not isinstance(w, int) or w <= 0]
        if bad:
            raise ValueError(f"{said}: {bad[0]!r} is not a positive integer width")
        widths = list(widths)  # a copy: the default list is shared, and d_sae may be appended
        over = [w for w in widths if w > cfg.d_sae]
        if over:
            raise ValueError(f"{said}: width {over[0]} is over d_sae={cfg.d_sae} (the widths nest inside the SAE)")
        if widths[-1] != cfg.d_sae:
            warnings.warn(
                f"{said}: the last width is not d_sae={cfg.d_sae}; a final level of width d_sae is appended "
                "(as sae-lens does)",
                stacklevel=2,
            )
            widths.append(cfg.d_sae)
        pairs = [(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True) if a >= b]
        if pairs:
            raise ValueError(f"{said}: the widths must be strictly increasing (nested prefixes); {pairs[0][0]} is "
                             f"followed by {pairs[0][1]}")  # fmt: skip
        if len(widths) == 1:
            warnings.warn(
                f"{said}: one level only, the same as a plain BatchTopK SAE (as sae-lens warns)", stacklevel=2
            )
        cfg.matryoshka_widths = widths

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        sae = trainer.sae
        widths = sae.cfg.matryoshka_widths
        pre, chosen, weights = self.select(trainer, x)
        prefixes = prefix_reconstructions(sae.W_dec, sae.b_dec, chosen, weights, widths, x.shape[0])
        x_hat = prefixes[:, -1]
        mse = mse_of(x_hat, x)
        parts = self.common_parts(trainer, x, chosen, pre.h.shape)
        parts.update(mse=mse, x_hat=x_hat.detach())
        loss = mse
        if trainer.cfg.use_matryoshka_aux_loss:
            aux = matryoshka_aux_loss(trainer, x, prefixes.detach(), pre)
        else:
            aux = aux_k_loss(trainer, x, x_hat, pre)
        if aux is not None:
            parts["aux"] = aux
            loss = loss + aux
        for level, width in enumerate(widths[:-1]):  # the outer level is "mse" itself
            inner = mse_of(prefixes[:, level], x)
            parts[f"inner_mse_{width}"] = inner
            loss = loss + inner
        return loss, parts


def prefix_reconstructions(
    W_dec: Tensor, b_dec: Tensor, chosen: Any, weights: Tensor, widths: list[int], n: int
) -> Tensor:
    """`[n, L, d_in]`: level l holds `b_dec + sum over the kept features i < widths[l]` of
    `weights_i * W_dec[i]`. One embedding_bag over the (row, level) bags, then a cumulative sum."""
    n_levels = len(widths)
    bounds = torch.tensor(widths, device=chosen.features.device)
    level = torch.bucketize(chosen.features, bounds, right=True)  # i < widths[0] -> 0, ...
    bag = chosen.rows * n_levels + level
    order = torch.argsort(bag, stable=True)
    counts = torch.bincount(bag, minlength=n * n_levels)
    per_level = F.embedding_bag(
        chosen.features[order], W_dec, counts.cumsum(0) - counts, mode="sum", per_sample_weights=weights[order]
    )
    return per_level.view(n, n_levels, -1).cumsum(1) + b_dec


def matryoshka_aux_loss(trainer: Any, x: Tensor, prefixes: Tensor, pre: PreActs) -> Tensor | None:
    """sae-lens' calculate_matryoshka_aux_loss (None while no feature is dead): per level l with dead
    features, the `min(k_aux, n_dead_l)` largest pre-activations among them reconstruct `x - x_hat_l`,
    scaled by `min(n_dead_l / k_aux, 1)`; the sum times aux_coefficient."""
    dead = trainer.dead_mask()
    if not bool(dead.any()):
        return None
    sae = trainer.sae
    k_aux = max(1, sae.cfg.d_in // 2)
    total: Tensor | None = None
    start = 0
    for level, width in enumerate(sae.cfg.matryoshka_widths):
        dead_here = dead[start:width].nonzero().squeeze(1) + start
        n_dead = int(dead_here.numel())
        start = width
        if not n_dead:
            continue
        residual = x - prefixes[:, level]
        loss = dead_reconstruction_loss(sae.W_dec, pre, residual, dead_here, min(k_aux, n_dead))
        term = min(n_dead / k_aux, 1.0) * loss
        total = term if total is None else total + term
    assert total is not None  # some level holds the dead features
    return trainer.cfg.aux_coefficient * total
