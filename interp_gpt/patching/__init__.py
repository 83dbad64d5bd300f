"""Activation patching (transformer-lens' sweeps, batched) and attribution patching.

Activation patching runs the model on a corrupted input, replaces one activation with
its value from a clean run, and measures how far a metric moves. transformer-lens'
`patching` module does one forward per patched index; the functions here have its
names, signatures and result tensors, but run many patched copies of the corrupted
input in one batched forward (`generic.py` says how). Attribution patching
(`attribution_patch`) estimates every patch of a sweep at once from two forwards and one
backward: `(clean_act - corrupted_act) * d metric / d act`, summed over the patched slice.

The modules, by job: `setters.py` (the patch setters), `generic.py` (the batched sweep,
`generic_activation_patch`), `sweeps.py` (the named `get_act_patch_*` sweeps),
`attribution.py` (attribution patching and its comparison with activation patching).

Example:
    >>> from interp_gpt import patching
    >>> from interp_gpt.metrics import normalized_logit_diff
    >>> _, clean_cache = model.run_with_cache(clean_tokens)
    >>> metric = normalized_logit_diff(answers, clean_logits, corrupted_logits)
    >>> patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric).shape
    torch.Size([12, 20])                                     # [n_layers, pos]
    >>> estimate = patching.attribution_patch(model, clean_tokens, corrupted_tokens, metric)
    >>> estimate["resid_pre"].shape                          # same layout, one backward pass
    torch.Size([12, 20])
"""

from __future__ import annotations

from . import attribution, generic, setters, sweeps
from .attribution import *  # noqa: F403
from .generic import *  # noqa: F403
from .generic import DEFAULT_ROWS_PER_FORWARD as DEFAULT_ROWS_PER_FORWARD
from .generic import AxisNames as AxisNames
from .generic import PatchingMetric as PatchingMetric
from .setters import *  # noqa: F403
from .setters import PatchSetter as PatchSetter
from .sweeps import *  # noqa: F403

# Every public name of the four modules (each module's __all__ lists its own).
__all__ = [*generic.__all__, *setters.__all__, *sweeps.__all__, *attribution.__all__]
