"""Sparse autoencoders: the `SAE` module in SAELens' format, and splicing them into the model.

Example:
    >>> from interp_gpt.sae import SAE
    >>> sae = SAE.from_pretrained("path/to/sae_folder")     # cfg.json + sae_weights.safetensors
    >>> with model.saes([sae], use_error_term=True):
    ...     _, cache = model.run_with_cache("Hello")
    >>> cache["blocks.1.hook_resid_pre.hook_sae_acts_post"]

model.py imports `splice` (GPT's SAE methods), so this package's __init__ runs while model.py loads:
import here only modules below model.py. Anything built on the model (a trainer, dashboards) must be
exported lazily (a module-level __getattr__), or importing interp_gpt fails with a circle.
"""

from .config import SAEConfig, SAEMetadata
from .core import SAE
from .io import KNOWN_RELEASES

__all__ = ["SAE", "SAEConfig", "SAEMetadata", "KNOWN_RELEASES"]
