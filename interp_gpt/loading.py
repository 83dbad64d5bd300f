"""Load GPT-2 checkpoints into `GPT`, process weights as transformer-lens does, and save them.

Sources (`from_pretrained(source)`):
  * a hub id: "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", or any
    GPT-2-architecture repo, fetched through huggingface_hub and its cache;
  * a shipped model by name ("tiny-gpt2"), loaded from inside the package, offline;
  * a local folder: config.json + model.safetensors (or sharded safetensors, or pytorch_model.bin);
  * a single weights file (.safetensors, or .bin/.pt/.pth read with weights_only=True);
  * a `transformers` GPT2LMHeadModel / GPT2Model object;
  * a transformer-lens HookedTransformer (3.x) or TransformerBridge (4.x), or a state dict
    in either layout.

Nothing here unpickles arbitrary code: `.bin` files load with `torch.load(weights_only=True)`.
The work is done below `model.py`, which does not import this module: sources.py reads,
convert.py converts layouts, processing.py folds and centres, pretrained.py builds the model.
This module gathers their public names in one place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoints.convert import (
    config_from_hf,
    convert_hf_gpt2_state_dict,
    convert_to_hf_gpt2_state_dict,
    load_source,
)
from .checkpoints.processing import (
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from .checkpoints.sources import (
    CONFIG_DIGEST_KEY,
    HUB_PRESETS,
    SHIPPED_DIR,
    CheckpointError,
    config_digest,
    resolve_shipped,
    shipped_models,
)
from .files import atomic_path, write_atomic
from .model.gpt import GPT

__all__ = [
    "CheckpointError",
    "HUB_PRESETS",
    "SHIPPED_DIR",
    "center_unembed",
    "center_writing_weights",
    "config_from_hf",
    "convert_hf_gpt2_state_dict",
    "convert_to_hf_gpt2_state_dict",
    "fold_layer_norm",
    "fold_value_biases",
    "from_pretrained",
    "from_pretrained_no_processing",
    "load_source",
    "process_weights",
    "resolve_shipped",
    "save_hf_checkpoint",
    "shipped_models",
]
# GPT's classmethods, as functions: `from_pretrained("gpt2")` is `GPT.from_pretrained("gpt2")`.
from_pretrained = GPT.from_pretrained
from_pretrained_no_processing = GPT.from_pretrained_no_processing


def save_hf_checkpoint(model: GPT, folder: str | os.PathLike) -> Path:
    """Save as a Hugging Face GPT-2 folder (config.json + model.safetensors) that
    `transformers.GPT2LMHeadModel.from_pretrained` and `from_pretrained` here both read.

    Each file is written whole or not at all (files.py), weights first: a save that fails
    leaves the old files as they were. The weights' metadata carries the sha256 of the
    config.json saved with them, so a folder left with new weights and the old config (a save
    cut off between its two files) is refused when loaded, never read as another model.
    """
    from safetensors.torch import save_file

    cfg = model.cfg
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        raise ValueError("save_hf_checkpoint: Hugging Face GPT-2 needs n_heads * d_head == d_model")
    tensors = convert_to_hf_gpt2_state_dict(model)  # raises for a model it cannot save: before any write
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # GPT-2's end-of-text id, or the model's own tokenizer's (a small vocabulary has no 50256).
    tok = model.tokenizer
    bos, eos = (tok.bos_token_id, tok.eos_token_id) if tok is not None else (50256, 50256)
    if max(bos, eos) >= cfg.d_vocab:
        bos = eos = cfg.d_vocab - 1
    hf_config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": cfg.n_layers,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_mlp,
        "vocab_size": cfg.d_vocab,
        "n_positions": cfg.n_ctx,
        "n_ctx": cfg.n_ctx,
        "activation_function": cfg.act_fn,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_range": cfg.init_range,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "tie_word_embeddings": False,
    }
    config_text = json.dumps(hf_config, indent=2)
    # A new file renamed over the old one, never the old file rewritten: a model loaded from
    # it maps its pages (see read_weights_file) and must keep the weights it was loaded with.
    weights = folder / "model.safetensors"
    try:
        with atomic_path(weights) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt", CONFIG_DIGEST_KEY: config_digest(config_text)})
    except Exception as e:  # safetensors' own errors (a full disk ...) name no file
        if isinstance(e, OSError):
            raise
        raise OSError(f"{weights}: could not be written ({e}); the folder is as it was") from e
    write_atomic(folder / "config.json", config_text)
    return folder
