"""Attribution patching: every patch of the sweeps estimated at once, from a clean forward,
a corrupted forward and one backward of the metric: `(clean_act - corrupted_act) * d metric / d act`,
summed over the patched slice. `attribution_vs_activation_patching` checks the estimate
against real activation patching.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from jaxtyping import Int
from torch import Tensor

from ..cache import ActivationCache
from ..checks import check_callable, check_gradient_reached, check_shape
from ..model.gpt import GPT
from ..utils import get_act_name
from .generic import PatchingMetric, as_tokens, check_model, generic_activation_patch, metric_value, scalar_metric
from .setters import COVERED_AXES, layer_pos_patch_setter
from .sweeps import SWEEPS, Sweep

__all__ = ["attribution_patch", "AttributionPatchResult", "attribution_vs_activation_patching", "AttributionComparison"]

# Attribution estimates laid out like the sweeps: resid_post has no transformer-lens sweep
# but is where a metric linear in the final residual makes the estimate exact.
_ATTRIBUTION_SWEEPS: dict[str, Sweep] = {
    **SWEEPS,
    "resid_post": ("resid_post", layer_pos_patch_setter, ("layer", "pos"), "[n_layers, pos]"),
}


@dataclass
class AttributionPatchResult:
    """Attribution-patching estimates of every patch, laid out like the sweeps.

    `estimates[sweep]` estimates `metric(patched) - metric(corrupted)` for the patch that
    `get_act_patch_<sweep>` makes: e.g. `estimates["resid_pre"]` is `[n_layers, pos]`,
    `estimates["attn_head_out_all_pos"]` `[n_layers, n_heads]`. `result[sweep]` reads it.
    `grads[hook_name]`: d metric / d activation at the corrupted run.
    """

    estimates: dict[str, Tensor]
    clean_metric: float
    corrupted_metric: float
    grads: dict[str, Tensor] = field(repr=False)
    clean_cache: ActivationCache = field(repr=False)
    corrupted_cache: ActivationCache = field(repr=False)

    def __getitem__(self, sweep: str) -> Tensor:
        if sweep not in self.estimates:
            raise KeyError(f"no attribution estimate for {sweep!r}; this result has {sorted(self.estimates)}")
        return self.estimates[sweep]

    def keys(self) -> list[str]:
        """The sweeps estimated (names such as `resid_pre`, `attn_head_out_all_pos`)."""
        return list(self.estimates)


def attribution_patch(
    model: GPT,
    clean_input: Int[Tensor, "batch pos"] | str | list[str],
    corrupted_input: Int[Tensor, "batch pos"] | str | list[str],
    metric: PatchingMetric,
    *,
    sweeps: Sequence[str] | None = None,
) -> AttributionPatchResult:
    """Estimate every patch of the sweeps at once: a linear approximation of activation
    patching from a clean forward, a corrupted forward and one backward of the metric.

    For a patch of slice S of activation `a`, the estimate of `metric(patched) -
    metric(corrupted)` is `sum over S of (a_clean - a_corrupted) * d metric / d a`, the
    gradient taken at the corrupted run. It is exact where the metric is linear in `a`
    (e.g. the last layer's `mlp_out` / `resid_post` with a metric linear in the final
    residual stream); elsewhere it is a first-order estimate.

    Args:
        clean_input: token ids `[batch, pos]` (or strings).
        corrupted_input: token ids (or strings), the same shape as `clean_input`.
        metric: logits -> scalar, differentiable (no `.item()`); as for the sweeps.
        sweeps: which estimates to compute (names as in `get_act_patch_<name>`, plus
            "resid_post"); default all.

    Example:
        >>> result = attribution_patch(model, clean_tokens, corrupted_tokens, metric)
        >>> result["resid_pre"].shape                  # [n_layers, pos]
        >>> result["attn_head_out_all_pos"].shape      # [n_layers, n_heads]
    """
    model = check_model(model)
    clean = as_tokens(model, clean_input, "clean_input")
    corrupted = as_tokens(model, corrupted_input, "corrupted_input")
    check_shape(corrupted, clean.shape, "corrupted_input", "clean_input's [batch, pos]")
    check_callable(metric, "metric", "a function of the logits")
    sweeps = list(_ATTRIBUTION_SWEEPS) if sweeps is None else list(sweeps)
    unknown = [s for s in sweeps if s not in _ATTRIBUTION_SWEEPS]
    if unknown:
        raise ValueError(f"sweeps: unknown sweep {unknown[0]!r}; known: {list(_ATTRIBUTION_SWEEPS)}")
    n_layers = model.cfg.n_layers
    activations = sorted({_ATTRIBUTION_SWEEPS[s][0] for s in sweeps})
    names = [get_act_name(a, layer) for a in activations for layer in range(n_layers)]

    # 1. Clean forward: the clean activations.
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean, names_filter=names)
        clean_metric = metric_value(metric, clean_logits)

    # 2. Corrupted forward with the graph kept, holding on to each activation tensor.
    acts: dict[str, Tensor] = {}

    def keep(t: Tensor, hook: Any) -> None:
        acts[hook.name] = t

    def ensure_grad(t: Tensor, hook: Any) -> Tensor | None:
        # With frozen parameters nothing would require grad; start the graph here.
        return None if t.requires_grad else t.detach().requires_grad_(True)

    with torch.enable_grad(), model.hooks(fwd_hooks=[("hook_embed", ensure_grad)] + [(n, keep) for n in names]):
        value = scalar_metric(metric, model(corrupted), "attribution patching")
        # 3. One backward pass; torch.autograd.grad leaves the parameters' .grad untouched.
        grads = torch.autograd.grad(value, [acts[n] for n in names], allow_unused=True)
    check_gradient_reached(grads, "metric", metric, "attribution_patch", "activation patched")
    grad_of = {
        n: (g if g is not None else torch.zeros_like(acts[n])).detach() for n, g in zip(names, grads, strict=True)
    }
    corrupted_cache = ActivationCache({n: acts[n].detach() for n in names}, model)

    estimates: dict[str, Tensor] = {}
    for sweep in sweeps:
        activation = _ATTRIBUTION_SWEEPS[sweep][0]
        layer_names = [get_act_name(activation, layer) for layer in range(n_layers)]
        prod = torch.stack([(clean_cache[n] - corrupted_cache[n]) * grad_of[n] for n in layer_names])
        estimates[sweep] = prod.sum(dim=COVERED_AXES[_ATTRIBUTION_SWEEPS[sweep][1]]).float()
    return AttributionPatchResult(
        estimates=estimates,
        clean_metric=clean_metric,
        corrupted_metric=float(value.item()),
        grads=grad_of,
        clean_cache=clean_cache,
        corrupted_cache=corrupted_cache,
    )


@dataclass
class AttributionComparison:
    """Attribution patching against activation patching for one sweep.

    `attribution` and `patching` both measure `metric(patched) - metric(corrupted)`;
    `correlation` is their Pearson correlation over all patches (nan if either is constant).
    """

    sweep: str
    attribution: Tensor
    patching: Tensor
    correlation: float

    @property
    def max_abs_error(self) -> float:
        """The largest absolute gap between the estimates and the patched effects."""
        return float((self.attribution - self.patching).abs().max())


def attribution_vs_activation_patching(
    model: GPT,
    clean_input: Int[Tensor, "batch pos"] | str | list[str],
    corrupted_input: Int[Tensor, "batch pos"] | str | list[str],
    metric: PatchingMetric,
    sweep: str = "resid_pre",
    *,
    attribution: AttributionPatchResult | None = None,
    batch_size: int | None = None,
    progress: bool = False,
) -> AttributionComparison:
    """How well attribution patching estimates real activation patching for one sweep:
    runs both (or reuses `attribution`) and reports the Pearson correlation.

    Example:
        >>> cmp = attribution_vs_activation_patching(model, clean_tokens, corrupted_tokens, metric, "resid_pre")
        >>> cmp.correlation, cmp.max_abs_error
    """
    model = check_model(model)
    if sweep not in _ATTRIBUTION_SWEEPS:
        raise ValueError(f"sweep={sweep!r}: expected one of {list(_ATTRIBUTION_SWEEPS)}")
    if attribution is None:
        attribution = attribution_patch(model, clean_input, corrupted_input, metric, sweeps=[sweep])
    estimate = attribution[sweep]
    clean = as_tokens(model, clean_input, "clean_input")
    corrupted = as_tokens(model, corrupted_input, "corrupted_input")
    activation, setter, axes, _ = _ATTRIBUTION_SWEEPS[sweep]
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(
            clean, names_filter=[get_act_name(activation, layer) for layer in range(model.cfg.n_layers)]
        )
    patched = generic_activation_patch(
        model, corrupted, clean_cache, metric, setter, activation, axes, batch_size=batch_size, progress=progress
    )
    delta = cast(Tensor, patched) - attribution.corrupted_metric  # a tensor: no index DataFrame was asked for
    pair = torch.stack([estimate.flatten().double().cpu(), delta.flatten().double().cpu()])
    correlation = float(torch.corrcoef(pair)[0, 1]) if pair.shape[1] > 1 else math.nan
    return AttributionComparison(sweep=sweep, attribution=estimate, patching=delta, correlation=correlation)
