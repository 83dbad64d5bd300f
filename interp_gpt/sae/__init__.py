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
    >>> tcs = load_transcoders("path/to/transcoders", model)  # converted to the model's weights, or refused

A transcoder records the weights it was made for (`cfg.metadata.model_processing`; raw unless its file
says, as circuit-tracer's are): spliced into, or loaded for, a model processed otherwise (fold_ln,
center_writing_weights) it is converted exactly (`Transcoder.converted_to`) or refused by name.

`interp_gpt.sae.benchmark.benchmark_architectures` (the `interp-gpt sae-bench` command) trains every SAE
architecture on the same data, on synthetic ground truth (`interp_gpt.sae.synthetic`) and on a real hook,
and writes up the scores.

GPT's splicing methods (add_sae, saes, ...) come from interp_gpt.model.splicing; the model imports
nothing from this package. An `SAE` follows that module's protocol (`splice_hooks`,
`splice_forward`), and so must anything else spliced in (a transcoder).
"""

from .saes.config import SAEConfig, SAEMetadata
from .saes.core import SAE
from .saes.io import KNOWN_RELEASES
from .transcoders.clt import CLTConfig, CrossLayerTranscoder, load_clt, save_clt
from .transcoders.config import TranscoderConfig
from .transcoders.processing import model_processing
from .transcoders.transcoder import Transcoder, check_transcoder_fits, load_transcoders, save_transcoders

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
    "model_processing",
    "CrossLayerTranscoder",
    "CLTConfig",
    "load_clt",
    "save_clt",
]
