"""SAELens' on-disk format: a folder with `cfg.json` and `sae_weights.safetensors`.

Reading checks everything before building anything: the config's fields, then every tensor's name,
shape and finiteness against it, each error naming the file. Writing goes through `interp_gpt.files`
(each file whole or not at all); the weights carry the sha256 of the cfg.json saved with them, so a
folder whose two files come from different saves is refused by name rather than loaded half-new.

A release in the local Hugging Face cache is found with huggingface_hub's own lookup
(`try_to_load_from_cache`), without the network: `"owner/repo"` plus the SAE's folder in it, or one
of the few sae-lens release names in `KNOWN_RELEASES`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...checkpoints.sources import CheckpointError, config_digest, read_json_object
from ...files import atomic_path
from ..common import (
    CFG_FILENAME,
    DIGEST_KEY,
    WEIGHTS_FILENAME,
    check_digest,
    check_tensors,
    config_from_file,
    read_safetensors,
    removed_if_left_empty,
)
from .config import SAEConfig

__all__ = ["CFG_FILENAME", "WEIGHTS_FILENAME", "KNOWN_RELEASES", "read_sae_folder", "write_sae_folder", "find_release"]

# sae-lens release names (its pretrained_saes.yaml) whose files are in its own format, sae_id = folder.
KNOWN_RELEASES = {
    "gpt2-small-res-jb": "jbloom/GPT2-Small-SAEs-Reformatted",
    "gpt2-small-res-jb-feature-splitting": "jbloom/GPT2-Small-Feature-Splitting-Experiment-Layer-8",
}

# SAEs shipped inside the package (see interp_gpt.sae.training): release name -> folder.
SHIPPED_RELEASES = {"tiny-gpt2-res": Path(__file__).resolve().parents[2] / "weights" / "tiny-gpt2-sae"}


def expected_shapes(cfg: SAEConfig) -> dict[str, tuple[int, ...]]:
    """The tensors an SAE of this config holds (its parameters, then its buffers), with sae-lens' names
    and shapes."""
    arch = cfg.architecture_module
    return {**arch.shapes(cfg), **{name: shape for name, (shape, _) in arch.buffers(cfg).items()}}


def read_config(path: Path) -> SAEConfig:
    """The SAEConfig of a cfg.json (CheckpointError naming the file)."""
    return config_from_file(SAEConfig, read_json_object(path), path)  # type: ignore[no-any-return]


def read_sae_folder(folder: Path, device: str | torch.device = "cpu") -> tuple[SAEConfig, dict[str, Tensor]]:
    """The config and the state dict of a saved SAE, checked against each other."""
    folder = Path(folder)
    cfg_path, weights_path = folder / CFG_FILENAME, folder / WEIGHTS_FILENAME
    missing = [p.name for p in (cfg_path, weights_path) if not p.is_file()]
    if missing:
        there = sorted(p.name for p in folder.iterdir())[:10] if folder.is_dir() else []
        raise FileNotFoundError(
            f"{folder}: an SAE folder needs {CFG_FILENAME} and {WEIGHTS_FILENAME}; missing {', '.join(missing)} "
            f"(the folder holds: {', '.join(there) or 'nothing'})"
        )
    cfg = read_config(cfg_path)
    state, meta = read_safetensors(weights_path, device)
    check_digest(meta, cfg_path, "SAE")
    _normalise_state(state, cfg, weights_path)
    dtype, kept = cfg.torch_dtype, cfg.architecture_module.float32_params(cfg)
    buffers = cfg.architecture_module.buffers(cfg)  # a buffer keeps its own dtype
    wide = torch.promote_types(dtype, torch.float32)  # a JumpReLU threshold: read into float32 (exact), never below
    return cfg, {k: v.to(buffers[k][1] if k in buffers else wide if k in kept else dtype) for k, v in state.items()}


def _normalise_state(state: dict[str, Tensor], cfg: SAEConfig, where: Path) -> None:
    """sae-lens' loading fix-ups, then the check of names, shapes and values (in place)."""
    if "log_threshold" in state and cfg.architecture == "jumprelu":  # older JumpReLU files
        state["threshold"] = torch.exp(state.pop("log_threshold"))
    if "scaling_factor" in state:  # an all-ones leftover of sae-lens' finetuning scaling
        sf = state.pop("scaling_factor")
        if not torch.all(sf == 1):
            raise CheckpointError(f"{where}: a finetuning 'scaling_factor' other than 1 is not supported")
    what = f"its tensors do not fit a {cfg.architecture} SAE with d_in={cfg.d_in}, d_sae={cfg.d_sae}: "
    check_tensors(state, expected_shapes(cfg), where, what)


def write_sae_folder(folder: Path, cfg: SAEConfig, state: dict[str, Tensor]) -> tuple[Path, Path]:
    """Write cfg.json and sae_weights.safetensors into `folder`, each whole or not at all. The weights
    file records the sha256 of its cfg.json; a folder this call created is removed again on failure."""
    from safetensors.torch import save_file

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"path: {str(folder)!r} is a file; expected a folder to save the SAE in")
    text = json.dumps(cfg.to_dict(), indent=2)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    weights_path, cfg_path = folder / WEIGHTS_FILENAME, folder / CFG_FILENAME
    # Both temporaries are written before either takes its name; cfg.json goes in first, the
    # weights (which name its digest) last, so a crash in between is caught by read_sae_folder.
    with removed_if_left_empty(folder), atomic_path(weights_path) as wtmp:
        save_file(tensors, str(wtmp), metadata={DIGEST_KEY: config_digest(text), "format": "pt"})
        with atomic_path(cfg_path) as ctmp:
            ctmp.write_text(text, encoding="utf-8")
    return weights_path, cfg_path


def _hub_cache_dir() -> str:
    """huggingface_hub's cache folder, read now (its constants are read once, at import)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return env
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def find_release(release: str, sae_id: str | None) -> Path:
    """The folder in the local Hugging Face cache that holds `release`'s SAE `sae_id` (offline)."""
    from huggingface_hub import try_to_load_from_cache

    if release in SHIPPED_RELEASES and sae_id in (None, "blocks.1.hook_resid_pre"):
        return SHIPPED_RELEASES[release]
    repo_id = KNOWN_RELEASES.get(release, release)
    if release.startswith((".", "/", "~")) or Path(release).suffix:
        raise FileNotFoundError(
            f"release={release!r}: no such folder (an SAE folder holds {CFG_FILENAME} and {WEIGHTS_FILENAME})"
        )
    if repo_id.count("/") != 1:
        raise ValueError(
            f"release={release!r} is neither a folder nor a Hugging Face repo id ('owner/name'); "
            f"known sae-lens release names: {', '.join(KNOWN_RELEASES)}"
        )
    prefix = f"{sae_id.strip('/')}/" if sae_id else ""
    cache = _hub_cache_dir()
    found: dict[str, Path] = {}
    for name in (CFG_FILENAME, WEIGHTS_FILENAME):
        try:
            hit: Any = try_to_load_from_cache(repo_id, prefix + name, cache_dir=cache)
        except ValueError as e:  # huggingface_hub's HFValidationError: not a valid repo id
            raise ValueError(f"release={release!r} is not a valid Hugging Face repo id ({e})") from e
        if isinstance(hit, str):
            found[name] = Path(hit)
    if len(found) == 2 and found[CFG_FILENAME].parent == found[WEIGHTS_FILENAME].parent:
        return found[CFG_FILENAME].parent
    looked = ", ".join(f"{repo_id}/{prefix}{n}" for n in (CFG_FILENAME, WEIGHTS_FILENAME))
    have = ", ".join(sorted(found)) or "neither"
    hint = "" if sae_id else " (pass sae_id=, the SAE's folder inside the repo, e.g. 'blocks.8.hook_resid_pre')"
    raise FileNotFoundError(
        f"SAE {release!r}{f' / {sae_id!r}' if sae_id else ''}: not found as a local folder, nor in the Hugging "
        f"Face cache {cache} (looked for {looked}; found {have}){hint}. Download it first, e.g. "
        f"huggingface_hub.snapshot_download({repo_id!r}, allow_patterns=['{prefix}*']), or pass a folder "
        f"holding {CFG_FILENAME} and {WEIGHTS_FILENAME}"
    )
