"""The SAE metrics, with sae-lens' definitions (`evaluate_sae`, and the training log):
* L0: mean number of active features per token;
* MSE: mean over tokens of the summed squared error;
* explained variance: `1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`;
* CE loss recovered: `(CE_zero_ablation - CE_spliced) / (CE_zero_ablation - CE_clean)`, where the
  hook's activation is replaced by zeros (zero ablation) or by the SAE's reconstruction (spliced);
* KL: the mean over positions of KL(clean next-token distribution || spliced one);
* dead / dense latents: the share of features that never fire on the tokens, and of features that fire
  on more than `DENSE_ABOVE` (10%) of them (SAEBench's core "dense" count).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..common import ce_batches, ce_metrics, check_eval_inputs, explained_variance
from .core import SAE

__all__ = ["explained_variance", "evaluate_sae", "DENSE_ABOVE"]

DENSE_ABOVE = 0.1  # a latent firing on more than this share of tokens counts as dense


@torch.no_grad()
def evaluate_sae(model: Any, sae: SAE, tokens: Tensor, batch_size: int = 32) -> dict[str, float]:
    """The SAE's metrics on `tokens` `[batch, pos]` at its hook: l0, mse, explained_variance,
    dead_fraction (features that never fire on these tokens), dense_fraction (features firing on more
    than 10% of them), ce_clean, ce_spliced, ce_zero_ablation, ce_loss_recovered, kl_div (see the
    module's docstring for the definitions). Every position counts (BOS too,
    as sae-lens' evaluation does by default).

    Example:
        >>> evaluate_sae(model, sae, token_windows(model, val_texts))["ce_loss_recovered"]
        0.95
    """
    if not isinstance(sae, SAE):
        raise TypeError(f"evaluate_sae: sae must be an interp_gpt SAE, got {type(sae).__name__}")
    hook = sae.cfg.hook_name
    if not isinstance(hook, str):
        raise ValueError("sae: its cfg.metadata.hook_name is not set; the metrics need the hook it reads")
    model.hook_points([hook], arg="sae.cfg.metadata.hook_name")
    tokens, batch_size = check_eval_inputs(model, tokens, batch_size, "evaluate_sae")
    with model.saes([sae]):  # refuses, by name, an SAE that does not fit the hook (width, dtype, device)
        pass
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    sse = tss_sum = 0.0
    n_rows, l0_sum = 0, 0.0
    x_sum = None
    counts = torch.zeros(sae.cfg.d_sae, dtype=torch.long, device=sae.device)
    for cache in ce_batches(model, tokens, batch_size, [hook], lambda: model.saes([sae]), [hook], ce):
        act = cache[hook].to(sae.device, sae.dtype)  # [batch, pos, ...]: a temporal SAE reads the sequence
        feats, x_hat = sae.encode_and_reconstruct(act)
        x = act.reshape(-1, sae.cfg.d_in)  # one row per token ([.., n_heads, d_head] flattened for hook_z)
        x_hat = x_hat.reshape(-1, sae.cfg.d_in)
        on = (feats != 0).reshape(-1, sae.cfg.d_sae)  # a signed (AbsTopK) feature fires when not 0
        counts += on.sum(0)
        l0_sum += float(on.sum())
        sse += float((x - x_hat).double().pow(2).sum())
        xd = x.double()
        x_sum = xd.sum(0) if x_sum is None else x_sum + xd.sum(0)
        tss_sum += float(xd.pow(2).sum())
        n_rows += x.shape[0]
    assert x_sum is not None
    tss = tss_sum - float(x_sum.pow(2).sum()) / n_rows  # sum ||x - mean||^2
    return {
        "l0": l0_sum / n_rows,
        "mse": sse / n_rows,
        "explained_variance": 1 - sse / tss,
        "dead_fraction": float((counts == 0).float().mean()),
        "dense_fraction": float((counts > DENSE_ABOVE * n_rows).float().mean()),
        **ce_metrics(ce, n_rows),
    }
