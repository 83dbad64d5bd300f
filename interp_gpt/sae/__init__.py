"""Sparse autoencoders and transcoders: the `SAE` module in SAELens' format, splicing it into the
model, per-layer `Transcoder`s (sae-lens' and circuit-tracer's files) and `CrossLayerTranscoder`s.

Example:
    >>> from interp_gpt.sae import SAE
    >>> sae = SAE.from_pretrained("path/to/sae_folder")     # cfg.json + sae_weights.safetensors
    >>> with model.saes([sae], use_error_term=True):
    ...     _, cache = model.run_with_cache("Hello")
    >>> cache["blocks.1.hook_resid_pre.hook_sae_acts_post"]
    >>> from interp_gpt.sae import load_transcoders, save_transcoders
    >>> tcs = load_transcoders("path/to/transcoders")       # sae-lens folders or circuit-tracer's config.yaml
    >>> save_transcoders(tcs, "copy", format="circuit-tracer")

model.py imports `splice` (GPT's SAE methods), so this package's __init__ runs while model.py loads:
import here only modules below model.py. Anything built on the model (a trainer, dashboards) must be
exported lazily (a module-level __getattr__), or importing interp_gpt fails with a circle.
"""

from .clt import CLTConfig, CrossLayerTranscoder, load_clt, save_clt
from .config import SAEConfig, SAEMetadata
from .core import SAE
from .io import KNOWN_RELEASES
from .transcoder import Transcoder, check_transcoder_fits, load_transcoders, save_transcoders
from .transcoder_config import TranscoderConfig

__all__ = [
    "SAE",
    "SAEConfig",
    "SAEMetadata",
    "KNOWN_RELEASES",
    "Transcoder",
    "TranscoderConfig",
    "load_transcoders",
    "save_transcoders",
    "check_transcoder_fits",
    "CrossLayerTranscoder",
    "CLTConfig",
    "load_clt",
    "save_clt",
]
