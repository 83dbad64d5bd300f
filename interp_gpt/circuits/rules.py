"""Backward rules: forward hooks that leave every forward value as it is and change only the gradient,
so that "EAP with a modified backward pass" (RelP, GIM) is EAP run with these hooks attached.

A rule set is a function `rules(model) -> [(hook_point, hook_fn), ...]`, called once per forward
(its hooks may share state within that forward: the GELU rule keeps `mlp.hook_pre` for `mlp.hook_post`).
Each hook hands back its input's values exactly (`x.detach()`, or a straight-through
`y.detach() + (x - x.detach()) * c`, or an autograd function whose forward returns its input);
only the backward differs. Hooks make the model take its explicit paths (LayerNorm in pieces, the
attention pattern materialised) instead of the fused kernels, which agree within float rounding.

- `relp_rules`: Relevance Patching (Jafari et al. 2025, arXiv 2508.21258), the LRP rules RelP's
  TransformerLens fork applies to GPT-2 by default (`LRP_rules = ['LN-rule', 'Identity-rule',
  'Half-rule']`): the LayerNorm scale is a constant (LN-rule), the MLP activation passes
  `act(x) / x` of the incoming relevance (Identity-rule); the Half-rule is for gated MLPs, which
  GPT-2 has none of; the AH-rule (the attention pattern a constant) is RelP's opt-in, `ah_rule=True`.
- `gim_rules`: Gradient Interaction Modifications (`gim-explain` 0.1.4's defaults on a
  transformer-lens model): the LayerNorm scale a constant, the attention softmax differentiated at
  temperature T (`diag(s_T) - s_T s_T^T`, s_T = softmax(scores / T)), and the gradients of q, k and
  v times 0.25, 0.25 and 0.5.

Example:
    >>> from functools import partial
    >>> from interp_gpt.circuits.scores import modified_eap_scores
    >>> scores = modified_eap_scores(model, clean, corrupted, metric, partial(gim_rules, temperature=2.0))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..checks import check_float
from ..hooks import HookPoint
from ..model.gpt import GPT, LayerNorm

__all__ = ["Rules", "frozen_norm_rules", "relp_rules", "gim_rules", "check_gim_options"]

Hook = tuple[HookPoint, Callable[..., Any]]
Rules = Callable[[GPT], list[Hook]]  # model -> forward hooks whose only effect is on the backward

# RelP's stabilizer of the Identity-rule's denominator (its lrp_utils.stabilize).
RELP_EPS = 1e-6


def _norms(model: GPT) -> list[LayerNorm]:
    """Every LayerNorm of the model (ln1, ln2, ln_final); a model without normalisation has none."""
    return [m for m in model.modules() if isinstance(m, LayerNorm)]


def _detach(x: Tensor, hook: Any) -> Tensor:
    return x.detach()


def frozen_norm_rules(model: GPT) -> list[Hook]:
    """Every LayerNorm's scale `sqrt(mean(centred^2) + eps)` a constant in the backward: the gradient
    to the LayerNorm's input is `w / scale`, centred, without the term through the scale (RelP's
    LN-rule; GIM's norm freezing). Forward values unchanged.

    Example:
        >>> hooks = frozen_norm_rules(model)        # one (ln.hook_scale, detach) per LayerNorm
    """
    return [(ln.hook_scale, _detach) for ln in _norms(model)]


def _straight_through(value: Tensor, x: Tensor, slope: Tensor) -> Tensor:
    """`value` in the forward (exactly: `x - x.detach()` is 0), `slope * grad` to `x` in the backward."""
    return value.detach() + (x - x.detach()) * slope.detach()


def _identity_rule(mlp: Any) -> list[Hook]:
    """RelP's Identity-rule on one MLP activation: post = act(pre) passes `act(pre) / stabilized(pre)`
    times the incoming gradient to pre (the activation seen as `pre * (act(pre) / pre)` with the
    ratio constant), where stabilized(x) = x + (sign(x) + [x == 0]) * 1e-6 as in RelP's code."""
    kept: dict[str, Tensor] = {}

    def keep_pre(x: Tensor, hook: Any) -> Tensor:
        kept["pre"] = x
        return x

    def relevance(post: Tensor, hook: Any) -> Tensor:
        pre = kept.pop("pre")
        with torch.no_grad():
            stabilized = pre + ((pre == 0).to(pre.dtype) + pre.sign()) * RELP_EPS
            ratio = post / stabilized
        return _straight_through(post, pre, ratio)

    return [(mlp.hook_pre, keep_pre), (mlp.hook_post, relevance)]


def relp_rules(model: GPT, *, ah_rule: bool = False) -> list[Hook]:
    """RelP's propagation rules for GPT-2 (Jafari et al. 2025, arXiv 2508.21258, its TransformerLens
    fork's defaults): the LN-rule (every LayerNorm scale a constant, `frozen_norm_rules`) and the
    Identity-rule on each MLP's activation (GELU passes `GELU(x) / x` of the relevance reaching it).
    Linear maps keep their gradient (the 0-rule); the Half-rule acts on gated MLPs only (none in GPT-2).

    Args:
        ah_rule: also the AH-rule, RelP's opt-in: every attention pattern a constant (relevance
            reaches the residual stream through the values only).

    Example:
        >>> hooks = relp_rules(model)
    """
    hooks = frozen_norm_rules(model)
    blocks: Any = model.blocks
    for block in blocks:
        mlp = getattr(block, "mlp", None)  # an attention-only block has none
        if mlp is not None:
            hooks += _identity_rule(mlp)
        if ah_rule:
            hooks.append((block.attn.hook_pattern, _detach))
    return hooks


class _SoftenedSoftmax(torch.autograd.Function):
    """Forward: the pattern as the model made it. Backward: the gradient to the scores as if the
    softmax were `s_T = softmax(scores / T)`, without the 1/T: `s_T * (g - sum(g * s_T))` (GIM's)."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, pattern: Tensor, temperature: float) -> Tensor:
        ctx.save_for_backward(scores)
        ctx.temperature = temperature
        return pattern.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (scores,) = ctx.saved_tensors
        soft = (scores / ctx.temperature).softmax(dim=-1)
        return soft * (grad - (grad * soft).sum(dim=-1, keepdim=True)), None, None


def _softened_softmax(attn: Any, temperature: float) -> list[Hook]:
    kept: dict[str, Tensor] = {}

    def keep_scores(x: Tensor, hook: Any) -> Tensor:
        kept["scores"] = x
        return x

    def soften(pattern: Tensor, hook: Any) -> Tensor:
        out: Tensor = _SoftenedSoftmax.apply(kept.pop("scores"), pattern.detach(), temperature)
        return out

    return [(attn.hook_attn_scores, keep_scores), (attn.hook_pattern, soften)]


def _times(scale: float) -> Callable[[Tensor, Any], Tensor]:
    def fn(x: Tensor, hook: Any) -> Tensor:
        return x.detach() + (x - x.detach()) * scale  # x in the forward, scale * grad in the backward

    return fn


def check_gim_options(
    temperature: Any, q_scale: Any, k_scale: Any, v_scale: Any, caller: str = "gim_rules"
) -> tuple[float, float, float, float]:
    """The GIM options, checked: a finite temperature > 0 and finite gradient scales > 0."""
    return (
        check_float(temperature, "temperature", 0.0, caller=caller),
        check_float(q_scale, "q_scale", 0.0, caller=caller),
        check_float(k_scale, "k_scale", 0.0, caller=caller),
        check_float(v_scale, "v_scale", 0.0, caller=caller),
    )


def gim_rules(
    model: GPT,
    *,
    temperature: float = 2.0,
    q_scale: float = 0.25,
    k_scale: float = 0.25,
    v_scale: float = 0.5,
    freeze_norm: bool = True,
) -> list[Hook]:
    """GIM's gradient modifications (Edin et al. 2025, "GIM: Improved Interpretability for Large
    Language Models"; `gim-explain` 0.1.4's defaults, as its transformer-lens path applies them):

    - norm freezing: every LayerNorm scale a constant (`frozen_norm_rules`; `freeze_norm=False`: off);
    - softmax temperature: each attention softmax's backward is that of `softmax(scores / T)`
      times T, i.e. `diag(s_T) - s_T s_T^T` with s_T = softmax(scores / T) (T = 1: the plain gradient);
    - q/k/v scaling: the gradients of every `attn.hook_q`, `hook_k`, `hook_v` times
      `q_scale`, `k_scale`, `v_scale`.

    GPT-2's MLPs are not gated, so GIM's gate/up scaling does nothing here.

    Example:
        >>> hooks = gim_rules(model, temperature=2.0)
    """
    temperature, q_scale, k_scale, v_scale = check_gim_options(temperature, q_scale, k_scale, v_scale)
    hooks = frozen_norm_rules(model) if freeze_norm else []
    blocks: Any = model.blocks
    for block in blocks:
        attn = block.attn
        if temperature != 1.0:
            hooks += _softened_softmax(attn, temperature)
        hooks += [(attn.hook_q, _times(q_scale)), (attn.hook_k, _times(k_scale)), (attn.hook_v, _times(v_scale))]
    return hooks
