"""Causal analysis on our hook points: interchange interventions, distributed alignment search, sparse probing
(transformer-lens 4.3's `transformer_lens.tools.analysis` definitions, on our model).

`interchange(model, hook, base, source, basis)` runs `base` with its activation at `hook` set, inside an
orthonormal `basis`, to the `source` run's: `h + s((src - h) B) B^T` (see `interchange.py`);
`norm_matched_placebo` is its control, the same distance inside a random subspace. Bases are plain
`[d, rank]` tensors: `orthonormal_basis`, `random_basis`, `mean_difference_basis`, checked by `check_basis`
(see `bases.py`). `fit_das` learns a basis by distributed alignment search (see `das.py`):

    result = fit_das(model, hook, base, source, targets, task_logits, rank=1)
    logits = interchange(model, hook, test_base, test_source, result.basis, task_logits=task_logits)
    placebo = norm_matched_placebo(model, hook, test_base, test_source, result.basis, task_logits=task_logits)

`sparse_probing(features, labels, k)` fits a k-sparse logistic probe (see `probing.py`).
Every activation is read through `model.run_with_cache` and every intervention is a hook: nothing here
runs a forward pass of its own.
"""

from __future__ import annotations

from .bases import check_basis, mean_difference_basis, orthonormal_basis, random_basis
from .das import DASResult, fit_das
from .interchange import collect_activations, interchange, norm_matched_placebo
from .probing import SparseProbe, sparse_probing

__all__ = [
    "check_basis",
    "collect_activations",
    "DASResult",
    "fit_das",
    "interchange",
    "mean_difference_basis",
    "norm_matched_placebo",
    "orthonormal_basis",
    "random_basis",
    "SparseProbe",
    "sparse_probing",
]
