"""The sparse autoencoder (`SAE`, sae-lens' format): the module, its config and files, whether it fits a
model, splicing it in, its metrics and its feature pages.

    core.py        SAE: encode / decode / forward, sae-lens' architectures and numerics
    config.py      SAEConfig, SAEMetadata: sae-lens' cfg.json
    io.py          sae-lens' folders (cfg.json + sae_weights.safetensors), releases
    fit.py         the hook an SAE reads and whether a model has it
    splice.py      add_sae / saes(...) on the model
    evaluation.py  explained variance, CE loss recovered, L0 (sae-lens' definitions)
    features.py    one feature's top contexts, histogram and promoted tokens; the features command
"""

from .config import SAEConfig, SAEMetadata
from .core import SAE
from .evaluation import evaluate_sae, explained_variance
from .io import KNOWN_RELEASES
from .splice import check_sae_fits

__all__ = ["SAE", "SAEConfig", "SAEMetadata", "KNOWN_RELEASES", "check_sae_fits", "evaluate_sae", "explained_variance"]
