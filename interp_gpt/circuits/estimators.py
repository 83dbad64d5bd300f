"""Edge scores from EAP with a modified backward pass: RelP and GIM, two of the estimators that lead
the MIB circuit track. Each is `score(s -> r) = sum over batch, pos of (corrupted_s - clean_s) . R_r`,
where R_r is the metric's gradient at receiver input r taken at the clean run under the method's
backward rules (`rules.py`); one clean forward, one corrupted forward, one backward, as EAP.

- RelP (Jafari et al. 2025, arXiv 2508.21258): LRP's rules for GPT-2, LayerNorm scales constant and
  the GELU passing `GELU(x) / x` of the relevance.
- GIM (Edin et al. 2025, arXiv 2505.17630): LayerNorm scales constant, the attention softmax
  differentiated at a temperature, the gradients of q, k, v scaled.

RelP's own demo takes the gradient at the corrupted run and the difference clean - corrupted
(denoising); these keep `eap_scores`' convention (gradient at the clean run, corrupted - clean), so
the three are comparable edge by edge.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor

from ..model.gpt import GPT
from ._run import Metric
from .rules import check_gim_options, gim_rules, relp_rules
from .scores import modified_eap_scores

__all__ = ["relp_scores", "gim_scores"]


def relp_scores(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    *,
    ah_rule: bool = False,
    progress: bool = False,
) -> Tensor:
    """Relevance patching: EAP with LRP's propagation coefficients in place of the gradient (RelP's
    rules for GPT-2, `rules.relp_rules`: LayerNorm scales constant, GELU's Identity-rule).

    Args:
        clean_tokens: `[batch, pos]` token ids (or strings), as `eap_scores`.
        corrupted_tokens: the same shape, or an ablation ("zero", "mean", "resample").
        metric: logits -> a scalar, differentiable.
        ah_rule: also treat every attention pattern as a constant (RelP's opt-in AH-rule).

    Returns:
        float32 `[n_edges]` scores in `Graph(model.cfg)`'s edge order.

    Example:
        >>> scores = relp_scores(model, clean, corrupted, metric)
        >>> Graph.from_model(model).top_edges(scores, k=5)
    """
    if not isinstance(ah_rule, bool):
        raise TypeError(f"relp_scores: ah_rule must be True or False, got {type(ah_rule).__name__} ({ah_rule!r})")
    rules = partial(relp_rules, ah_rule=ah_rule)
    return modified_eap_scores(
        model, clean_tokens, corrupted_tokens, metric, rules, progress=progress, caller="relp_scores"
    )


def gim_scores(
    model: GPT,
    clean_tokens: Any,
    corrupted_tokens: Any,
    metric: Metric,
    *,
    temperature: float = 2.0,
    q_scale: float = 0.25,
    k_scale: float = 0.25,
    v_scale: float = 0.5,
    progress: bool = False,
) -> Tensor:
    """EAP with GIM's gradient modifications (`rules.gim_rules`, gim-explain's defaults): LayerNorm
    scales constant, each attention softmax differentiated at `temperature`, the gradients of q, k
    and v times `q_scale`, `k_scale`, `v_scale`.

    Args:
        clean_tokens: `[batch, pos]` token ids (or strings), as `eap_scores`.
        corrupted_tokens: the same shape, or an ablation ("zero", "mean", "resample").
        metric: logits -> a scalar, differentiable.
        temperature: the softmax backward's temperature (> 0; 1: the plain softmax gradient).

    Returns:
        float32 `[n_edges]` scores in `Graph(model.cfg)`'s edge order.

    Example:
        >>> scores = gim_scores(model, clean, corrupted, metric, temperature=2.0)
    """
    t, q, k, v = check_gim_options(temperature, q_scale, k_scale, v_scale, caller="gim_scores")
    rules = partial(gim_rules, temperature=t, q_scale=q, k_scale=k, v_scale=v)
    return modified_eap_scores(
        model, clean_tokens, corrupted_tokens, metric, rules, progress=progress, caller="gim_scores"
    )
