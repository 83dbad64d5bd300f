"""The BatchTopK SAE (sae-lens' BatchTopKTrainingSAE): k features per token on average over the batch.

    h = (x - b_dec) @ W_enc + b_enc          (times ||W_dec[i]|| with rescale_acts_by_decoder_norm)
    f = ReLU(h) on the int(k * n) largest entries of ReLU(h) over all n rows of the batch, 0 elsewhere
    x_hat = f @ W_dec + b_dec                (f / ||W_dec[i]|| with rescale_acts_by_decoder_norm)

`k` may be a float (sae-lens' `k: float`). Training: TopK's loss (MSE plus AuxK on the dead features);
after each step the running threshold follows the smallest positive activation of the batch,
`topk_threshold <- (1 - topk_threshold_lr) * topk_threshold + topk_threshold_lr * min(f > 0)` (a float64
buffer, in the state dict). Encoding here is what sae-lens' BatchTopKTrainingSAE.encode does: the
selection is over all rows passed in at once (flattened over every leading axis), so a row's features
depend on its batch. For inference `SAE.save_model` writes the batch-independent form, as sae-lens'
`save_inference_model` does: a "jumprelu" SAE whose threshold is `topk_threshold` for every feature
(the decoder norms folded in first with rescale_acts_by_decoder_norm); loading that folder gives a
JumpReLU SAE.

Speed: no dense `[n, d_sae]` decode and no ranking of all `n * d_sae` activations: each row's `ceil(k)`
largest give a lower bound on the batch's cut, only the values above it are ranked, and the kept
(row, feature, value) triples, in row order, decode with one `embedding_bag` over a flat index and
per-row offsets.

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="batchtopk", k=8,
    ...                     metadata={"hook_name": "blocks.1.hook_resid_pre"}))
    >>> SAETrainer(sae).train(batches, n_steps=1000)
    >>> sae.save_model("my-sae")            # a JumpReLU SAE, threshold = sae.topk_threshold
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ...common import SAEMetadata
from .base import decoder_norms, mse_of
from .topk import PreActs, TopK, aux_k_loss, folded_norms_state

__all__ = ["BatchTopK", "BatchSelection", "batch_topk", "new_threshold"]


@dataclasses.dataclass
class BatchSelection:
    """The activations BatchTopK keeps, row by row: `rows`, `features` and `values` `[nnz]` (values > 0,
    differentiable), with `counts` `[n]` per row and `offsets` `[n]` where each row starts."""

    rows: Tensor
    features: Tensor
    values: Tensor
    counts: Tensor
    offsets: Tensor

    def dense(self, n: int, d_sae: int) -> Tensor:
        """The activations as a dense `[n, d_sae]` tensor (zeros elsewhere)."""
        out = self.values.new_zeros(n, d_sae)
        return out.index_put_((self.rows, self.features), self.values)


def batch_topk(hidden_pre: Tensor, k: float) -> BatchSelection:
    """The `int(k * n)` largest of `ReLU(hidden_pre)` `[n, d_sae]` over the whole batch (sae-lens'
    BatchTopK), zeros left out. Exact without ranking all `n * d_sae` values: the `n_keep`-th largest
    of each row's `ceil(k)` largest is a lower bound on the cut (they are `>= n_keep` of the batch's
    values), so every kept value is among those above it, and the cut is the `n_keep`-th largest of those."""
    n, d_sae = hidden_pre.shape
    n_keep = int(k * n)  # sae-lens: int(self.k * num_samples)
    h = hidden_pre.detach()
    if n_keep == 0:
        rows = features = torch.zeros(0, dtype=torch.long, device=h.device)
    else:
        floor = 0.0  # zeros are never kept (sae-lens keeps them past the positives: they change nothing)
        if n_keep < h.numel():
            candidates = h.topk(min(d_sae, math.ceil(k)), dim=-1, sorted=False).values.flatten()
            floor = max(floor, float(_kth_largest(candidates, n_keep)))  # <= the cut
        rows, features = (h > 0 if floor == 0 else h >= floor).nonzero(as_tuple=True)  # row-major
        if rows.numel() > n_keep:  # more than n_keep at or above the bound: rank only those
            values = h[rows, features]
            kept = values >= _kth_largest(values, n_keep)
            rows, features = rows[kept], features[kept]
    counts = torch.bincount(rows, minlength=n)
    return BatchSelection(rows, features, hidden_pre[rows, features], counts, counts.cumsum(0) - counts)


def _kth_largest(values: Tensor, k: int) -> Tensor:
    """The `k`-th largest of a 1-D tensor (k in 1..numel)."""
    return values.kthvalue(values.numel() - k + 1).values


def new_threshold(threshold: Tensor, values: Tensor, lr: float) -> Tensor:
    """sae-lens' update_topk_threshold: `(1 - lr) * threshold + lr * min(values)` in float64 (the
    threshold as it was when `values`, the positive activations, is empty)."""
    if not values.numel():
        return threshold.clone()
    return (1 - lr) * threshold + lr * values.detach().min().to(threshold.dtype)


class BatchTopK(TopK):
    """k features per token on average over the batch (sae-lens' "batchtopk"); saved as "jumprelu"."""

    name: ClassVar[str] = "batchtopk"
    # sae-lens' k default; rescale off and a unit-norm decoder by default as our TopK (sae-lens trains
    # BatchTopK with rescale_acts_by_decoder_norm=True: set it, and the decoder is left free)
    fields: ClassVar[dict[str, Any]] = {"k": 100, "rescale_acts_by_decoder_norm": False}
    saved_as: ClassVar[str | None] = "jumprelu"

    def check_config(self, cfg: Any) -> None:
        k = cfg.k
        if isinstance(k, bool) or not isinstance(k, (int, float)):
            raise TypeError(
                f"k={k!r}: expected a positive number (features per row on average), got {type(k).__name__}"
            )
        if not (math.isfinite(k) and 0 < k <= cfg.d_sae):
            raise ValueError(f"k={k!r}: expected a number > 0 and <= d_sae={cfg.d_sae} (features per row on average)")

    def buffers(self, cfg: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"topk_threshold": ((), torch.float64)}  # sae-lens: float64 "to avoid numerical issues"

    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        if sae.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * decoder_norms(sae)
        flat = hidden_pre.reshape(-1, hidden_pre.shape[-1])  # sae-lens: over every leading axis at once
        return batch_topk(flat, sae.cfg.k).dense(*flat.shape).view(hidden_pre.shape)

    # ----- training -----------------------------------------------------------------------
    def init_weights(self, trainer: Any, x: Tensor) -> None:
        trainer.default_init(x)
        trainer.sae.topk_threshold.zero_()

    def select(self, trainer: Any, x: Tensor) -> tuple[PreActs, BatchSelection, Tensor]:
        """(the pre-activations, the kept activations (differentiable values), their decoder weights)."""
        pre = PreActs(trainer.sae, x)
        chosen = batch_topk(pre.h, trainer.sae.cfg.k)
        chosen.values = pre.at(chosen.rows, chosen.features)
        weights = chosen.values if pre.inv_norm is None else chosen.values * pre.inv_norm[chosen.features]
        return pre, chosen, weights

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        sae = trainer.sae
        pre, chosen, weights = self.select(trainer, x)
        x_hat = (
            F.embedding_bag(chosen.features, sae.W_dec, chosen.offsets, mode="sum", per_sample_weights=weights)
            + sae.b_dec
        )
        mse = mse_of(x_hat, x)
        parts = self.common_parts(trainer, x, chosen, pre.h.shape)
        parts.update(mse=mse, x_hat=x_hat.detach())
        aux = aux_k_loss(trainer, x, x_hat, pre)
        if aux is not None:
            parts["aux"] = aux
            return mse + aux, parts
        return mse, parts

    def common_parts(self, trainer: Any, x: Tensor, chosen: BatchSelection, shape: torch.Size) -> dict[str, Tensor]:
        """The features (dense, detached), the features fired, and this step's new running threshold
        (logged as "topk_threshold", as sae-lens; taken into the SAE by `after_step`)."""
        with torch.no_grad():
            fired = torch.zeros(shape[-1], dtype=torch.bool, device=x.device)
            fired[chosen.features] = True
            return {
                "feats": chosen.dense(*shape).detach(),
                "fired": fired,
                "topk_threshold": new_threshold(
                    trainer.sae.topk_threshold, chosen.values, trainer.cfg.topk_threshold_lr
                ),
            }

    def after_step(self, trainer: Any, parts: dict[str, Tensor]) -> None:
        trainer.sae.topk_threshold.copy_(parts["topk_threshold"])

    def inference_state(self, sae: Any, state: dict[str, Tensor]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """sae-lens' BatchTopKTrainingSAE.save_inference_model: the decoder norms folded in (with
        rescale_acts_by_decoder_norm), then a JumpReLU SAE, threshold = topk_threshold for every
        feature; its own fields go to metadata.training_architecture_details, as sae-lens writes them."""
        state = dict(folded_norms_state(sae, state))
        threshold = float(state.pop("topk_threshold").item())
        state["threshold"] = torch.ones_like(state["b_enc"]) * threshold
        defaults = {f.name: f.default for f in dataclasses.fields(sae.cfg)}
        details = {name: getattr(sae.cfg, name) for name in self.fields}
        metadata = SAEMetadata(
            {**sae.cfg.metadata, "training_architecture": self.name, "training_architecture_details": details}
        )
        changes = {"architecture": self.saved_as, "metadata": metadata, **{n: defaults[n] for n in self.fields}}
        return changes, state
