"""Checkpoints, from where they live to the weights the model loads: sources -> convert -> processing.

    sources.py      where a checkpoint lives: a hub id, a local folder, a weights file; CheckpointError
    convert.py      Hugging Face GPT-2 configs and tensors <-> our Config and state dict
    processing.py   transformer-lens' weight processing on a state dict (fold_ln, centring, ...)

Nothing here imports the model (`interp_gpt.model`): the model's loading methods call down into this
package, and `interp_gpt.loading` is the public face of both.
"""

from .convert import config_from_hf, config_from_transformer_lens, convert_hf_gpt2_state_dict, load_source
from .processing import process_weights
from .sources import CheckpointError, hub_id, shipped_models

__all__ = [
    "CheckpointError", "hub_id", "shipped_models", "load_source", "config_from_hf", "config_from_transformer_lens",
    "convert_hf_gpt2_state_dict", "process_weights",
]  # fmt: skip
