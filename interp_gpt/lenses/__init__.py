"""Lenses: read what the residual stream at each layer predicts.

- `logit_lens` (`logit.py`): every layer's residual stream through `ln_final` and the unembedding, as
  transformer-lens 4.3's `tools.analysis.logit_lens`; `readout` is the step underneath it.
- `jacobian_lens` (`jacobian.py`): a fitted matrix per layer that moves its `resid_post` to the last
  layer's before the readout, as transformer-lens 4.3's `JacobianLens.fit`.
- `TunedLens` (`tuned.py`, tuned-lens 0.2's definition and files): per layer an affine translator on
  `blocks.{l}.hook_resid_pre`, decoded by the model's own ln_final and unembedding; trained with
  `fit_tuned_lens` (`train.py`: KL to the model's output, tuned-lens' optimiser).

Example:
    >>> from interp_gpt.lenses import TunedLens, fit_tuned_lens, jacobian_lens, lens_kl, logit_lens
    >>> logit_lens(model, "The cat sat on the mat").labels[-1]
    'final_post'
    >>> lens = fit_tuned_lens(model, "data/corpus", steps=2, batch_size=2, context_size=32, progress=False)
    >>> lens.forward_all("The cat sat").shape          # [layer, batch, pos, d_vocab]
    torch.Size([2, 1, 5, 2048])
"""

from .jacobian import JacobianLens, jacobian_lens
from .logit import LogitLensResult, logit_lens, readout
from .train import LensDiverged, fit_tuned_lens, lens_kl, lens_windows
from .tuned import PROCESSING_KEY, TunedLens, lens_processing, unembed_hash

__all__ = [
    "JacobianLens",
    "LogitLensResult",
    "jacobian_lens",
    "logit_lens",
    "readout",
    "TunedLens",
    "fit_tuned_lens",
    "lens_kl",
    "lens_windows",
    "LensDiverged",
    "lens_processing",
    "unembed_hash",
    "PROCESSING_KEY",
]
