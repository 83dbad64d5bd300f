"""Sparse autoencoders: the `SAE` module in SAELens' format, and splicing them into the model.

Example:
    >>> from interp_gpt.sae import SAE
    >>> sae = SAE.from_pretrained("path/to/sae_folder")     # cfg.json + sae_weights.safetensors
    >>> with model.saes([sae], use_error_term=True):
    ...     _, cache = model.run_with_cache("Hello")
    >>> cache["blocks.1.hook_resid_pre.hook_sae_acts_post"]

GPT's splicing methods (add_sae, saes, ...) come from interp_gpt.splicing, below the model; model.py
imports nothing from this package. An `SAE` follows that module's protocol (`splice_hooks`,
`splice_forward`), and so must anything else spliced in (a transcoder).
"""

from .config import SAEConfig, SAEMetadata
from .core import SAE
from .io import KNOWN_RELEASES

__all__ = ["SAE", "SAEConfig", "SAEMetadata", "KNOWN_RELEASES"]
