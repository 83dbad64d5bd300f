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

Speed: no dense `[n, d_sae]` decode and no sort of all `n * d_sae` activations. Each row's `m` largest
pre-activations are candidates (m = 4k, doubled while some row may hold more of the batch's top ones);
the batch's `int(k * n)`-th largest candidate is the cut; the chosen (row, feature, value) triples, in
row order, decode with one `embedding_bag` over a flat index and per-row offsets.

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
from .base import mse_of
from .topk import TopK, aux_k_loss, folded_norms_state, training_pre_acts

__all__ = ["BatchTopK", "BatchSelection", "batch_topk", "new_threshold"]

# Candidates per row: this many times k at first (at least _MIN_CANDIDATES), doubled while too few.
_CANDIDATES_PER_K, _MIN_CANDIDATES = 4, 16


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
        return out.index_put((self.rows, self.features), self.values)


def batch_topk(hidden_pre: Tensor, k: float) -> BatchSelection:
    """The `int(k * n)` largest of `ReLU(hidden_pre)` `[n, d_sae]` over the whole batch (sae-lens'
    BatchTopK), zeros left out. Exact: a row's candidates are widened until each row either holds no
    more positive values than it kept, or its smallest candidate is below the cut."""
    n, d_sae = hidden_pre.shape
    n_keep = int(k * n)  # sae-lens: int(self.k * num_samples)
    m = min(d_sae, max(_MIN_CANDIDATES, _CANDIDATES_PER_K * math.ceil(k)))
    while True:
        if m >= d_sae:
            cand_values, cand_features = hidden_pre.relu(), None
        else:
            top, cand_features = hidden_pre.topk(m, dim=-1, sorted=False)
            cand_values = top.relu()
        flat = cand_values.detach().flatten()
        if n_keep == 0:
            cut = flat.new_tensor(math.inf)
        elif n_keep >= flat.numel():
            cut = flat.new_tensor(-math.inf)
        else:
            cut = flat.kthvalue(flat.numel() - n_keep + 1).values  # the n_keep-th largest
        if cand_features is None:
            break
        smallest = cand_values.detach().min(dim=-1).values
        if bool(((smallest < cut) | (smallest == 0)).all()):  # no row left a chosen value out
            break
        m = min(2 * m, d_sae)
    keep = (cand_values.detach() >= cut) & (cand_values.detach() > 0)
    rows, cols = keep.nonzero(as_tuple=True)  # row-major: each row's entries together
    features = cols if cand_features is None else cand_features[rows, cols]
    counts = keep.sum(-1)
    return BatchSelection(rows, features, cand_values[rows, cols], counts, counts.cumsum(0) - counts)


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
    loss_names: ClassVar[tuple[str, ...]] = ("aux",)
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
            hidden_pre = hidden_pre * (sae.W_dec.norm(dim=-1))
        flat = hidden_pre.reshape(-1, hidden_pre.shape[-1])  # sae-lens: over every leading axis at once
        return batch_topk(flat, sae.cfg.k).dense(*flat.shape).view(hidden_pre.shape)

    # ----- training -----------------------------------------------------------------------
    def init_weights(self, trainer: Any, x: Tensor) -> None:
        trainer.default_init(x)
        trainer.sae.topk_threshold.zero_()

    def select(self, trainer: Any, x: Tensor) -> tuple[Tensor, Tensor | None, BatchSelection, Tensor]:
        """(pre-activations, 1 / decoder norms or None, the kept activations, their decoder weights)."""
        hidden_pre, inv_norm = training_pre_acts(trainer.sae, x)
        chosen = batch_topk(hidden_pre, trainer.sae.cfg.k)
        weights = chosen.values if inv_norm is None else chosen.values * inv_norm[chosen.features]
        return hidden_pre, inv_norm, chosen, weights

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        sae = trainer.sae
        hidden_pre, inv_norm, chosen, weights = self.select(trainer, x)
        x_hat = (
            F.embedding_bag(chosen.features, sae.W_dec, chosen.offsets, mode="sum", per_sample_weights=weights)
            + sae.b_dec
        )
        mse = mse_of(x_hat, x)
        parts = self.common_parts(trainer, x, chosen, hidden_pre.shape)
        parts.update(mse=mse, x_hat=x_hat.detach())
        aux = aux_k_loss(trainer, x, x_hat, hidden_pre, inv_norm)
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
