"""`SAEConfig`: the fields of SAELens' `cfg.json` (sae-lens 6.x), read and written as it does.

A 6.x `cfg.json` holds the SAE's shape and behaviour at the top level and what it was trained on
under `metadata` (`metadata.hook_name` is where it reads from):

    {"d_in": 768, "d_sae": 24576, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": true,
     "normalize_activations": "none", "reshape_activations": "none", "architecture": "standard",
     "metadata": {"hook_name": "blocks.8.hook_resid_pre", "model_name": "gpt2-small", ...}}

TopK SAEs add `k` and `rescale_acts_by_decoder_norm`. Files written before sae-lens 6.0 kept
`hook_name` (or `hook_point`) and the other metadata at the top level and said TopK through
`activation_fn` / `activation_fn_kwargs`; `SAEConfig.from_dict` reads them as sae-lens 6 does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["SAEConfig", "SAEMetadata", "ARCHITECTURES", "NORMALIZATIONS", "parse_dtype"]

ARCHITECTURES = ("standard", "topk", "jumprelu")
# What sae-lens 6 accepts; "covariance_whitening" is refused at build time (see SAE.__init__).
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm", "covariance_whitening")
_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
}
# The cfg.json a 6.x sae-lens reads as its own layout needs a version >= 6 in metadata; without one it
# takes the file for a pre-6.0 one and rebuilds metadata from top-level keys (losing metadata.hook_name).
_FORMAT_VERSION = "6.0.0"
# Keys sae-lens 6 moved from the top level of a pre-6.0 cfg.json into metadata.
_PRE6_METADATA_KEYS = (
    "model_name",
    "hook_name",
    "model_class_name",
    "hook_head_index",
    "model_from_pretrained_kwargs",
    "prepend_bos",
    "exclude_special_tokens",
    "neuronpedia_id",
    "context_size",
    "seqpos_slice",
    "dataset_path",
    "sae_lens_version",
    "sae_lens_training_version",
    "hook_name_out",
    "hook_head_index_out",
    "hf_hook_name",
    "hf_hook_name_out",
)


# The boolean fields: JSON true / false only (a string "false" is truthy; 0.5 would scale b_dec).
_BOOL_FIELDS = ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm")
# Metadata keys this package reads, and the type each must have when present (None: not recorded).
_METADATA_TYPES: dict[str, type] = {
    "hook_name": str,
    "model_name": str,
    "hook_head_index": int,
}
_KIND_NAMES = {str: "a string", int: "an integer"}


class SAEMetadata(dict):  # type: ignore[type-arg]
    """What an SAE was trained on (model_name, hook_name, ...): a dict whose keys read as attributes,
    a missing one as None (as sae-lens' `SAEMetadata`).

    Example:
        >>> SAEMetadata(hook_name="blocks.1.hook_resid_pre").hook_name
        'blocks.1.hook_resid_pre'
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def to_dict(self) -> dict[str, Any]:
        """The metadata as a plain dict."""
        return dict(self)


def parse_dtype(value: Any, arg: str = "dtype") -> torch.dtype:
    """A dtype from a torch.dtype or a name ("float32", "torch.bfloat16", ...)."""
    if isinstance(value, torch.dtype):
        if value.is_floating_point:
            return value
    elif isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ValueError(f"{arg}={value!r} is not a float dtype; expected one of {', '.join(list(_DTYPES)[:4])}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class SAEConfig:
    """An SAE's shape and behaviour, with the field names of sae-lens 6's `cfg.json`.

    Example:
        >>> cfg = SAEConfig(d_in=64, d_sae=256, architecture="topk", k=8,
        ...                 metadata=SAEMetadata(hook_name="blocks.1.hook_resid_pre"))
        >>> cfg.hook_name
        'blocks.1.hook_resid_pre'
    """

    d_in: int  # the width of the activation it reads (d_model for the residual stream)
    d_sae: int  # the number of features
    architecture: str = "standard"  # "standard" (ReLU), "topk" or "jumprelu"
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True  # encode x - b_dec rather than x
    normalize_activations: str = "none"  # see NORMALIZATIONS
    reshape_activations: str = "none"  # "hook_z": read [..., n_heads, d_head] as [..., n_heads * d_head]
    k: int | None = None  # topk: features kept per token
    rescale_acts_by_decoder_norm: bool = False  # topk: rank and decode acts * |W_dec row| (sae-lens' training form)
    metadata: SAEMetadata = field(default_factory=SAEMetadata)

    def __post_init__(self) -> None:
        # Every field's type first (a JSON "false" is truthy, 0.5 halves b_dec), then its value.
        if not isinstance(self.metadata, SAEMetadata):
            if not isinstance(self.metadata, dict):
                raise TypeError(f"metadata: expected a dict (a JSON object), got {type(self.metadata).__name__}")
            self.metadata = SAEMetadata(self.metadata)
        for name, kind in _METADATA_TYPES.items():
            v = self.metadata.get(name)
            if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
                raise TypeError(f"metadata.{name}={v!r}: expected {_KIND_NAMES[kind]}, got {type(v).__name__}")
        for name in ("d_in", "d_sae", "k"):
            v = getattr(self, name)
            if v is None and name == "k":
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}={v!r}: expected a positive integer, got {type(v).__name__}")
            if v < 1:
                raise ValueError(f"{name}={v!r}: expected a positive integer")
        for name in _BOOL_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise TypeError(f"{name}={v!r}: expected a boolean (JSON true or false), got {type(v).__name__}")
        if isinstance(self.device, torch.device):
            self.device = str(self.device)
        for name in ("architecture", "normalize_activations", "reshape_activations", "device"):
            v = getattr(self, name)
            if not isinstance(v, str):
                raise TypeError(f"{name}={v!r}: expected a string, got {type(v).__name__}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture={self.architecture!r} is not supported; expected one of {', '.join(ARCHITECTURES)}"
            )
        if self.architecture == "topk":
            if self.k is None:
                self.k = 100  # sae-lens' TopKSAEConfig default
            if not 1 <= self.k <= self.d_sae:
                raise ValueError(f"k={self.k!r}: expected an integer in 1..d_sae={self.d_sae}")
        self.dtype = dtype_name(parse_dtype(self.dtype))
        if self.normalize_activations not in NORMALIZATIONS:
            raise ValueError(
                f"normalize_activations={self.normalize_activations!r}; expected one of {', '.join(NORMALIZATIONS)}"
            )
        if self.reshape_activations not in ("none", "hook_z"):
            raise ValueError(f"reshape_activations={self.reshape_activations!r}; expected 'none' or 'hook_z'")

    @property
    def hook_name(self) -> str | None:
        """Where the SAE reads from: `metadata.hook_name` (e.g. "blocks.8.hook_resid_pre")."""
        name = self.metadata.get("hook_name")
        return name if isinstance(name, str) else None

    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as a torch dtype."""
        return parse_dtype(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """The cfg.json sae-lens 6 writes (and reads back as its own)."""
        out: dict[str, Any] = {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": self.dtype,
            "device": self.device,
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": self.normalize_activations,
            "reshape_activations": self.reshape_activations,
        }
        if self.architecture == "topk":
            out["k"] = self.k
            out["rescale_acts_by_decoder_norm"] = self.rescale_acts_by_decoder_norm
        meta = self.metadata.to_dict()
        meta.setdefault("sae_lens_version", _FORMAT_VERSION)
        meta.setdefault("sae_lens_training_version", meta["sae_lens_version"])
        out["metadata"] = meta
        out["architecture"] = self.architecture
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "cfg") -> SAEConfig:
        """Read a cfg.json's contents (6.x layout, or the pre-6.0 one converted as sae-lens does).
        Keys it does not know are kept in metadata when they come from a pre-6.0 file, else ignored."""
        if not isinstance(d, dict):
            raise TypeError(f"{where}: expected a JSON object, got {type(d).__name__}")
        meta_in = d.get("metadata")
        if meta_in is not None and not isinstance(meta_in, dict):
            raise ValueError(f"{where}: metadata must be an object, got {type(meta_in).__name__}")
        version = d.get("sae_lens_version") or (meta_in or {}).get("sae_lens_version")
        if not is_6x(version):
            d = from_pre_6(d)
        missing = [k for k in ("d_in", "d_sae") if k not in d]
        if missing:
            raise ValueError(f"{where}: missing field {missing[0]!r} (an SAE config needs d_in and d_sae)")
        nulls = [k for k in _BOOL_FIELDS if k in d and d[k] is None]
        if nulls:
            raise ValueError(f"{where}: {nulls[0]}=null: expected a boolean (JSON true or false)")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names and v is not None}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e


def is_6x(version: Any) -> bool:
    if not isinstance(version, str):
        return False
    head = version.split(".")[0]
    return head.isdigit() and int(head) >= 6


def from_pre_6(d: dict[str, Any]) -> dict[str, Any]:
    """sae-lens' handle_pre_6_0_config: rename old keys, infer the architecture, move metadata."""
    rename = {
        "hook_point": "hook_name",
        "hook_point_head_index": "hook_head_index",
        "activation_fn_str": "activation_fn",
    }
    new = {rename.get(k, k): v for k, v in d.items()}
    arch = new.get("architecture") or "standard"
    kwargs = new.get("activation_fn_kwargs") or {}
    if new.get("activation_fn") == "topk" and isinstance(kwargs, dict) and kwargs.get("k") is not None:
        arch, new["k"] = "topk", kwargs["k"]
    new["architecture"] = arch
    norm = new.get("normalize_activations")
    if isinstance(norm, bool) or norm is None:
        new["normalize_activations"] = "expected_average_only_in" if norm else "none"
    if "reshape_activations" not in new:
        new["reshape_activations"] = "hook_z" if "hook_z" in str(new.get("hook_name", "")) else "none"
    meta = dict(new.get("metadata") or {})
    meta.update({k: new[k] for k in _PRE6_METADATA_KEYS if k in new})
    new["metadata"] = meta
    return new
