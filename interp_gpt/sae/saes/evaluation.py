"""The SAE metrics, with sae-lens' definitions (`evaluate_sae`, and the training log):
* L0: mean number of active features per token;
* MSE: mean over tokens of the summed squared error;
* explained variance: `1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`;
* CE loss recovered: `(CE_zero_ablation - CE_spliced) / (CE_zero_ablation - CE_clean)`, where the
  hook's activation is replaced by zeros (zero ablation) or by the SAE's reconstruction (spliced).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...checks import check_int_in_range, check_tokens
from .core import SAE

__all__ = ["explained_variance", "evaluate_sae"]


def explained_variance(x: Tensor, x_hat: Tensor) -> float:
    """sae-lens' explained variance of rows `x` `[n, d]` by `x_hat`: 1 - SSE / total sum of squares.

    Example:
        >>> explained_variance(x, sae(x))
        0.93
    """
    x, x_hat = x.double(), x_hat.double()
    return float(1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


@torch.no_grad()
def evaluate_sae(model: Any, sae: SAE, tokens: Tensor, batch_size: int = 32) -> dict[str, float]:
    """The SAE's metrics on `tokens` `[batch, pos]` at its hook: l0, mse, explained_variance,
    dead_fraction (features that never fire on these tokens), ce_clean, ce_spliced, ce_zero_ablation,
    ce_loss_recovered (see the module's docstring for the definitions). Every position counts (BOS too,
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
    tokens = check_tokens(tokens, model.cfg.d_vocab, model.cfg.n_ctx, caller="evaluate_sae")
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller="evaluate_sae")
    with model.saes([sae]):  # refuses, by name, an SAE that does not fit the hook (width, dtype, device)
        pass
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    sse = tss_sum = 0.0
    n_rows, l0_sum = 0, 0.0
    x_sum = None
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=sae.device)

    def zero(act: Tensor, hook: Any) -> Tensor:
        return torch.zeros_like(act)

    for i in range(0, tokens.shape[0], batch_size):
        t = tokens[i : i + batch_size].to(model.W_E.device)
        w = t.shape[0] / tokens.shape[0]
        loss, cache = model.run_with_cache(t, names_filter=[hook], return_type="loss")
        ce["clean"] += float(loss) * w
        act = cache[hook].to(sae.device, sae.dtype)
        # one row per token ([n, n_heads, d_head] for a hook_z SAE, which flattens it itself)
        rows = act.flatten(0, 1) if sae.cfg.reshape_activations == "hook_z" else act.reshape(-1, sae.cfg.d_in)
        feats = sae.encode(rows)
        x_hat = sae.decode(feats).reshape(-1, sae.cfg.d_in)
        x = rows.reshape(-1, sae.cfg.d_in)
        fired |= (feats > 0).any(0)
        l0_sum += float((feats > 0).sum())
        sse += float((x - x_hat).double().pow(2).sum())
        xd = x.double()
        x_sum = xd.sum(0) if x_sum is None else x_sum + xd.sum(0)
        tss_sum += float(xd.pow(2).sum())
        n_rows += x.shape[0]
        with model.saes([sae]):
            ce["spliced"] += float(model(t, return_type="loss")) * w
        ce["zero"] += float(model.run_with_hooks(t, return_type="loss", fwd_hooks=[(hook, zero)])) * w
    assert x_sum is not None
    tss = tss_sum - float(x_sum.pow(2).sum()) / n_rows  # sum ||x - mean||^2
    return {
        "l0": l0_sum / n_rows,
        "mse": sse / n_rows,
        "explained_variance": 1 - sse / tss,
        "dead_fraction": float((~fired).float().mean()),
        "ce_clean": ce["clean"],
        "ce_spliced": ce["spliced"],
        "ce_zero_ablation": ce["zero"],
        "ce_loss_recovered": (ce["zero"] - ce["spliced"]) / (ce["zero"] - ce["clean"]),
        "n_tokens": float(n_rows),
    }
