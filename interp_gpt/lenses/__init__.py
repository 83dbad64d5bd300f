"""Lenses: read a layer's residual stream as the model's prediction.

- `logit_lens` (`logit.py`): every layer's residual stream through `ln_final` and the unembedding, as
  transformer-lens 4.3's `tools.analysis.logit_lens`; `readout` is the step underneath it.
- `jacobian_lens` (`jacobian.py`): a fitted matrix per layer that moves its `resid_post` to the last
  layer's before the readout, as transformer-lens 4.3's `JacobianLens.fit`.

Example:
    >>> from interp_gpt.lenses import jacobian_lens, logit_lens
    >>> logit_lens(model, "The cat sat on the mat").labels[-1]
    'final_post'
"""

from .jacobian import JacobianLens, jacobian_lens
from .logit import LogitLensResult, logit_lens, readout

__all__ = ["JacobianLens", "LogitLensResult", "jacobian_lens", "logit_lens", "readout"]
