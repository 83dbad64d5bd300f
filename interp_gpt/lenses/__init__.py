"""Lenses: read what the residual stream at each layer predicts.

The tuned lens (`TunedLens`, tuned-lens 0.2's definition and files): per layer an affine translator
on `blocks.{l}.hook_resid_pre`, decoded by the model's own ln_final and unembedding; trained with
`fit_tuned_lens` (KL to the model's output, tuned-lens' optimiser).

Example:
    >>> from interp_gpt.lenses import TunedLens, fit_tuned_lens, lens_kl
    >>> lens = fit_tuned_lens(model, "data/corpus", steps=2, batch_size=2, context_size=32, progress=False)
    >>> lens.forward_all("The cat sat").shape          # [layer, batch, pos, d_vocab]
    torch.Size([2, 1, 5, 2048])
"""

from .train import fit_tuned_lens, lens_kl, lens_windows
from .tuned import PROCESSING_KEY, TunedLens, lens_processing, unembed_hash

__all__ = [
    "TunedLens",
    "fit_tuned_lens",
    "lens_kl",
    "lens_windows",
    "lens_processing",
    "unembed_hash",
    "PROCESSING_KEY",
]
