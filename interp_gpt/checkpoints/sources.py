"""Reading checkpoints: files (safetensors memory-mapped copy-on-write; .bin with
`torch.load(weights_only=True)`, never arbitrary unpickling), folders, shipped models and the
Hugging Face hub. What is read is turned into our layout by convert.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "HUB_PRESETS",
    "HUB_ALIASES",
    "hub_id",
    "SHIPPED_DIR",
    "shipped_models",
    "resolve_shipped",
    "HF_BUFFER",
    "CheckpointError",
    "read_weights_file",
    "read_folder",
    "read_json_object",
    "CONFIG_DIGEST_KEY",
    "config_digest",
    "FileReader",
    "looks_like_path",
    "download_checkpoint",
]

HUB_PRESETS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")
# transformer-lens' other names for the GPT-2 family (its MODEL_ALIASES), matched case-insensitively as it does.
HUB_ALIASES = {
    "gpt2-small": "gpt2",
    **dict.fromkeys(("distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs"), "distilgpt2"),
}


def hub_id(name: str) -> str:
    """The hub id a transformer-lens alias names ("gpt2-small" -> "gpt2"); any other name unchanged."""
    return HUB_ALIASES.get(name.lower(), name)


# Models shipped inside the package, loadable by folder name with no network.
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "weights"


def shipped_models() -> dict[str, Path]:
    """The models shipped in the package: name -> folder."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(SHIPPED_DIR.iterdir()) if (p / "config.json").is_file()}


def resolve_shipped(source: Any) -> Any:
    """A shipped model's name -> its folder; any other source unchanged."""
    return shipped_models().get(source, source) if isinstance(source, str) else source


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# Buffers Hugging Face's GPT-2 stores in older checkpoints; they hold no weights.
HF_BUFFER = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")


class CheckpointError(ValueError):
    """A checkpoint whose tensors or config do not fit a GPT-2."""


# transposed() reads this many rows at a time.
_READ_CHUNK = 4096


def read_weights_file(path: Path) -> tuple[dict[str, Tensor], list[Path]]:
    """A weights file's tensors, and the files they came from.

    safetensors files are memory-mapped privately (copy-on-write), as Hugging Face reads
    them: a page of the file is read when first used, and writing a tensor changes only
    this process's copy, never the file.
    """
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), [path]
        except Exception as e:  # the safetensors library's own errors name no file
            size = path.stat().st_size
            raise CheckpointError(
                f"{path}: not a readable safetensors file ({size:,} bytes; empty or truncated?): {type(e).__name__}: {e}"
            ) from e
    if path.suffix == ".json":  # sharded safetensors index
        index = read_json_object(path)
        if not isinstance(index.get("weight_map"), dict):
            raise CheckpointError(f"{path}: a sharded-weights index needs a 'weight_map' object")
        out: dict[str, Tensor] = {}
        files: list[Path] = []
        for shard in sorted(set(index["weight_map"].values())):
            tensors, read = read_weights_file(path.parent / shard)
            out.update(tensors)
            files += read
        return out, files
    if path.suffix in (".bin", ".pt", ".pth"):
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # an unpickling error names the forbidden global
            raise CheckpointError(
                f"{path}: could not be read with torch.load(weights_only=True) ({type(e).__name__}: {e}); "
                "interp_gpt never unpickles arbitrary objects: convert the checkpoint to safetensors"
            ) from e
        if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
            sd = sd["state_dict"]
        if not isinstance(sd, Mapping):
            raise CheckpointError(f"{path}: expected a state dict (a mapping of tensors), got {type(sd).__name__}")
        return dict(sd), [path]
    raise CheckpointError(f"{path}: unknown weights format {path.suffix!r}; expected .safetensors, .bin, .pt or .pth")


def read_folder(folder: Path) -> tuple[dict[str, Tensor], dict[str, Any] | None, list[Path]]:
    for name in _WEIGHT_FILES:
        if (folder / name).exists():
            weights, files = read_weights_file(folder / name)
            break
    else:
        shards = sorted(folder.glob("model-*.safetensors"))
        if not shards:
            raise FileNotFoundError(f"{folder}: no weights found; expected one of {', '.join(_WEIGHT_FILES)}")
        weights, files = {}, []
        for shard in shards:
            tensors, read = read_weights_file(shard)
            weights.update(tensors)
            files += read
    config_path = folder / "config.json"
    hf_config = read_json_object(config_path) if config_path.exists() else None
    if hf_config is not None:
        _check_saved_together(config_path, files)
    return weights, hf_config, files


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object (config.json, an index): CheckpointError otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object {{...}}, got a {type(value).__name__}")
    return value


# save_hf_checkpoint writes the sha256 of the config.json it saves into the weights file's metadata.
CONFIG_DIGEST_KEY = "interp_gpt_config_sha256"


def config_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_saved_together(config_path: Path, files: list[Path]) -> None:
    """Refuse a folder whose config.json is not the one saved with its weights: a save cut off
    between its two files (see save_hf_checkpoint) must never load as another model."""
    from safetensors import safe_open

    for f in files:
        if f.suffix != ".safetensors":
            continue
        with safe_open(str(f), framework="pt") as h:
            wanted = (h.metadata() or {}).get(CONFIG_DIGEST_KEY)
        if wanted is not None and wanted != config_digest(config_path.read_text(encoding="utf-8")):
            raise CheckpointError(
                f"{config_path}: is not the config saved with {f.name} (an interrupted save?); save the model again"
            )


class FileReader:
    """Single tensors of the safetensors files a load read, each through a map of its own that
    is dropped with the tensor: what is copied out of the file this way is never left resident
    twice (the load's own map keeps every page it has touched until the model is freed)."""

    def __init__(self, files: list[Path]) -> None:
        # The files as they were read: a file replaced since then is refused, not mixed in.
        self.files = {f: _identity(f) for f in files if f.suffix == ".safetensors"}

    def _find(self, key: str) -> tuple[Path, str] | None:
        from safetensors import safe_open

        for f, identity in self.files.items():
            if _identity(f) != identity:
                raise CheckpointError(f"{f}: the file changed while it was being loaded; load it again")
            with safe_open(str(f), framework="pt") as h:
                name = next((n for n in (key, "transformer." + key) if n in h.keys()), None)
            if name is not None:
                return f, name
        return None

    def get(self, key: str) -> Tensor | None:
        """The tensor (None if no file holds it), mapped until it is freed."""
        from safetensors import safe_open

        if (found := self._find(key)) is None:
            return None
        with safe_open(str(found[0]), framework="pt") as h:
            return h.get_tensor(found[1])

    def transposed(self, key: str) -> Tensor | None:
        """The transpose of a [rows, cols] tensor as a new contiguous tensor, read _READ_CHUNK
        rows at a time: for W_U, GPT-2's lm_head (or the wte it is tied to)."""
        from safetensors import safe_open

        if (found := self._find(key)) is None:
            return None
        with safe_open(str(found[0]), framework="pt") as h:
            rows, cols = h.get_slice(found[1]).get_shape()
            out = torch.empty(cols, rows, dtype=h.get_slice(found[1])[:1].dtype)
        for i in range(0, rows, _READ_CHUNK):
            if _identity(found[0]) != self.files[found[0]]:
                raise CheckpointError(f"{found[0]}: the file changed while it was being loaded; load it again")
            with safe_open(str(found[0]), framework="pt") as h:
                out[:, i : i + _READ_CHUNK] = h.get_slice(found[1])[i : i + _READ_CHUNK].T
        return out


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def looks_like_path(s: str) -> bool:
    """A string that names a file or folder rather than a hub id ("owner/name" has one slash)."""
    return (
        s.startswith((".", "/", "~"))
        or s.count("/") > 1
        or s.endswith((".safetensors", ".bin", ".pt", ".pth", ".json"))
    )


def download_checkpoint(repo_id: str) -> Path:
    """Fetch a GPT-2 repo's config, weights and tokenizer files through the hub cache."""
    from huggingface_hub import hf_hub_download, snapshot_download

    repo_id = hub_id(repo_id)
    patterns = [
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "model-*.safetensors",
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
    ]
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns))
        if not any((folder / f).exists() for f in _WEIGHT_FILES[:2]) and not list(folder.glob("model-*.safetensors")):
            hf_hub_download(repo_id, "pytorch_model.bin")  # old repos without safetensors
            folder = Path(snapshot_download(repo_id, allow_patterns=patterns + ["pytorch_model.bin"]))
    except Exception as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
        why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else f"{type(e).__name__}: {e}"
        known = (
            ""
            if "/" in repo_id
            else (f" Known names: {', '.join(list(shipped_models()) + list(HUB_PRESETS))} (shipped ones load offline).")
        )
        raise OSError(
            f"could not load {repo_id!r} from the Hugging Face hub ({why}).{known} "
            "Or point at a local copy: a folder with config.json and model.safetensors "
            "(e.g. one saved by transformers' save_pretrained), or a weights file."
        ) from e
    return folder
