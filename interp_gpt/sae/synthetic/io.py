"""A `SyntheticModel` on disk, in sae-lens' folder format (`SyntheticModel.save` / `load_from_disk`):

    synthetic_model_config.json   the SyntheticModelConfig's dict
    synthetic_model.safetensors   feature_vectors [num_features, hidden_dim], bias [hidden_dim],
                                  firing_probabilities [num_features], and, with a correlation,
                                  correlation_factor [num_features, rank], correlation_diag [num_features]
    hierarchy.json                {"roots": [...]}, only when the model has a hierarchy

Loading takes those parts from the files and makes the rest (the magnitudes) from the config, as
sae-lens does, so a folder either library wrote loads in the other as the same model. Each file is
written whole or not at all; the weights record the sha256 of the two JSON files saved with them, so
a folder mixing two saves is refused here.

Example:
    >>> model = SyntheticModel(SyntheticModelConfig(num_features=32, hidden_dim=16, seed=0))
    >>> save_synthetic_model(model, "toy")
    >>> load_synthetic_model("toy").sample(4, seed=0).shape
    torch.Size([4, 16])
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import Tensor

from ...checkpoints.sources import CheckpointError
from ...files import atomic_path
from ..common import check_tensors, read_safetensors, removed_if_left_empty
from .dictionary import FeatureDictionary
from .distributions import LowRankCorrelationMatrix
from .hierarchy import Hierarchy
from .synthetic_model import SyntheticModel, SyntheticModelConfig

__all__ = [
    "SYNTHETIC_MODEL_CONFIG_FILENAME",
    "SYNTHETIC_MODEL_WEIGHTS_FILENAME",
    "SYNTHETIC_MODEL_HIERARCHY_FILENAME",
    "save_synthetic_model",
    "load_synthetic_model",
]

SYNTHETIC_MODEL_CONFIG_FILENAME = "synthetic_model_config.json"
SYNTHETIC_MODEL_WEIGHTS_FILENAME = "synthetic_model.safetensors"
SYNTHETIC_MODEL_HIERARCHY_FILENAME = "hierarchy.json"
_DIGEST_KEY = "interp_gpt_json_sha256"  # of the config's text + the hierarchy's (empty without one)


def _digest(cfg_text: str, hierarchy_text: str) -> str:
    return hashlib.sha256((cfg_text + "\0" + hierarchy_text).encode("utf-8")).hexdigest()


def save_synthetic_model(model: SyntheticModel, path: str | os.PathLike[str]) -> Path:
    """Write `model` into the folder `path` (made if needed) in sae-lens' format; returns the folder.
    Other files there stay; a hierarchy.json left by an earlier save goes when the model has none."""
    if not isinstance(model, SyntheticModel):
        raise TypeError(f"save_synthetic_model: model must be a SyntheticModel, got {type(model).__name__}")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"path: {str(folder)!r} is a file; expected a folder to save the synthetic model in")
    cfg_text = json.dumps(model.cfg.to_dict(), indent=2)
    h_text = "" if model.hierarchy is None else json.dumps(model.hierarchy.to_dict(), indent=2)
    gen, fd = model.activation_generator, model.feature_dict
    weights = {
        "feature_vectors": fd.feature_vectors.data,
        "bias": fd.bias.data,
        "firing_probabilities": gen.firing_probabilities,
    }
    if model.correlation_matrix is not None:
        weights["correlation_factor"], weights["correlation_diag"] = model.correlation_matrix
    weights = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    from safetensors.torch import save_file

    with removed_if_left_empty(folder):
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / SYNTHETIC_MODEL_CONFIG_FILENAME) as tmp:
            tmp.write_text(cfg_text, encoding="utf-8")
        if h_text:
            with atomic_path(folder / SYNTHETIC_MODEL_HIERARCHY_FILENAME) as tmp:
                tmp.write_text(h_text, encoding="utf-8")
        else:
            (folder / SYNTHETIC_MODEL_HIERARCHY_FILENAME).unlink(missing_ok=True)
        with atomic_path(folder / SYNTHETIC_MODEL_WEIGHTS_FILENAME) as tmp:  # last: the save is complete
            save_file(weights, str(tmp), metadata={_DIGEST_KEY: _digest(cfg_text, h_text)})
    return folder


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e


def load_synthetic_model(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> SyntheticModel:
    """The `SyntheticModel` saved in the folder `path` (by sae-lens or by `save_synthetic_model`), its files
    checked: both required files present, every tensor's shape against the config, finite values,
    probabilities in [0, 1], the hierarchy's feature indices in range."""
    folder = Path(path)
    cfg_path, w_path = folder / SYNTHETIC_MODEL_CONFIG_FILENAME, folder / SYNTHETIC_MODEL_WEIGHTS_FILENAME
    if missing := [p.name for p in (cfg_path, w_path) if not p.is_file()]:
        raise FileNotFoundError(
            f"{folder}: a synthetic model folder needs {SYNTHETIC_MODEL_CONFIG_FILENAME} and "
            f"{SYNTHETIC_MODEL_WEIGHTS_FILENAME}; missing {', '.join(missing)}"
        )
    cfg_text = cfg_path.read_text(encoding="utf-8")
    try:
        cfg = SyntheticModelConfig.from_dict(_json(cfg_path))  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: {e}") from e
    h_path = folder / SYNTHETIC_MODEL_HIERARCHY_FILENAME
    h_text = h_path.read_text(encoding="utf-8") if h_path.is_file() else ""
    state, meta = read_safetensors(w_path, "cpu")
    if (digest := meta.get(_DIGEST_KEY)) is not None and digest != _digest(cfg_text, h_text):
        raise CheckpointError(
            f"{folder}: {SYNTHETIC_MODEL_WEIGHTS_FILENAME} was saved with other JSON files than the ones beside it "
            "(an interrupted save?); save the synthetic model again"
        )
    n, d = cfg.num_features, cfg.hidden_dim
    shapes: dict[str, tuple[int, ...]] = {"feature_vectors": (n, d), "bias": (d,), "firing_probabilities": (n,)}
    if "correlation_factor" in state or "correlation_diag" in state:
        rank = state["correlation_factor"].shape[-1] if "correlation_factor" in state else 0
        shapes |= {"correlation_factor": (n, rank), "correlation_diag": (n,)}
    check_tensors(state, shapes, w_path, f"its tensors do not fit num_features={n}, hidden_dim={d}: ")
    p = state["firing_probabilities"]
    if bool(((p < 0) | (p > 1)).any()):
        i = int(((p < 0) | (p > 1)).nonzero()[0])
        raise CheckpointError(f"{w_path}: firing_probabilities[{i}]={p[i].item():.6g} is out of range: expected [0, 1]")
    try:
        hierarchy = Hierarchy.from_dict(_json(h_path)) if h_text else None  # type: ignore[arg-type]
        if hierarchy is not None:
            hierarchy.check_fits(n, arg=str(h_path))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{h_path}: {e}") from e
    corr = None
    if "correlation_factor" in state:
        corr = LowRankCorrelationMatrix(
            _on(state["correlation_factor"], device), _on(state["correlation_diag"], device)
        )
    fd = FeatureDictionary.from_vectors(_on(state["feature_vectors"], device), _on(state["bias"], device))
    return SyntheticModel(cfg, fd, hierarchy, corr, _on(p, device), device=device)


def _on(t: Tensor, device: str | torch.device) -> Tensor:
    return t.to(device)
