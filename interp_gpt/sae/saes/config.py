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
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ..common import (
    ConfigDtype,
    SAEMetadata,
    check_bools,
    check_positive_ints,
    check_strings,
    coerce_metadata,
    config_from_fields,
    dtype_name,
    from_pre_6,
    is_6x,
    parse_dtype,
    saelens_cfg_dict,
    saelens_cfg_json,
)
from .architectures import ARCHITECTURES, FIELD_OWNERS, get_architecture

__all__ = [
    "SAEConfig",
    "SAEMetadata",
    "ARCHITECTURES",
    "NORMALIZATIONS",
    "parse_dtype",
    "dtype_name",
    "is_6x",
    "from_pre_6",
]

# What sae-lens 6 accepts; "covariance_whitening" is refused at build time (see SAE.__init__);
# "constant_scalar_rescale" (times activation_normalization_factor) is a temporal SAE's only.
NORMALIZATIONS = (
    "none", "expected_average_only_in", "constant_norm_rescale", "layer_norm", "covariance_whitening",
    "constant_scalar_rescale",
)  # fmt: skip
# The boolean fields: JSON true / false only (a string "false" is truthy; 0.5 would scale b_dec).
_BOOL_FIELDS = ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm")
# Metadata keys this package reads, and the type each must have when present (None: not recorded).
_METADATA_TYPES: dict[str, type] = {
    "hook_name": str,
    "model_name": str,
    "hook_head_index": int,
}
_KIND_NAMES = {str: "a string", int: "an integer"}
# The per-architecture fields (after `metadata`): each owned by the architectures that list it.
_ARCH_FIELDS = (
    "k", "rescale_acts_by_decoder_norm", "matryoshka_widths", "residual_threshold", "max_iterations",
    "stop_on_duplicate_support", "n_heads", "n_attn_layers", "bottleneck_factor", "sae_diff_type", "kval_topk",
    "tied_weights", "activation_normalization_factor",
)  # fmt: skip


@dataclass
class SAEConfig(ConfigDtype):
    """An SAE's shape and behaviour, with the field names of sae-lens 6's `cfg.json`.

    Example:
        >>> cfg = SAEConfig(d_in=64, d_sae=256, architecture="topk", k=8,
        ...                 metadata=SAEMetadata(hook_name="blocks.1.hook_resid_pre"))
        >>> cfg.hook_name
        'blocks.1.hook_resid_pre'
    """

    d_in: int  # the width of the activation it reads (d_model for the residual stream)
    d_sae: int  # the number of features
    architecture: str = "standard"  # see ARCHITECTURES (interp_gpt.sae.saes.architectures)
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True  # encode x - b_dec rather than x
    normalize_activations: str = "none"  # see NORMALIZATIONS
    reshape_activations: str = "none"  # "hook_z": read [..., n_heads, d_head] as [..., n_heads * d_head]
    # The fields of one architecture each (its module says which, with their defaults: see FIELD_OWNERS);
    # another architecture's field must keep the default here (None / False) or it is refused by name.
    k: int | float | None = None  # topk family: features kept per token (batchtopk: on average, may be a float)
    rescale_acts_by_decoder_norm: bool = False  # topk: rank and decode acts * |W_dec row| (sae-lens' training form)
    metadata: SAEMetadata = field(default_factory=SAEMetadata)
    _: KW_ONLY  # the later architectures' fields, by name only
    matryoshka_widths: list[int] | None = None  # matryoshka_batchtopk: the nested prefix widths
    residual_threshold: float | None = None  # matching_pursuit: stop when the residual's norm is below this
    max_iterations: int | None = None  # matching_pursuit: at most this many features per token
    stop_on_duplicate_support: bool | None = None  # matching_pursuit: stop when a feature is chosen again
    n_heads: int | None = None  # temporal: attention heads over the context
    n_attn_layers: int | None = None  # temporal
    bottleneck_factor: int | None = None  # temporal
    sae_diff_type: str | None = None  # temporal: "relu" or "topk" for the novel code
    kval_topk: int | None = None  # temporal
    tied_weights: bool | None = None  # temporal
    activation_normalization_factor: float | None = None  # temporal

    def __post_init__(self) -> None:
        # Every field's type first (a JSON "false" is truthy, 0.5 halves b_dec), then its value.
        self.metadata = coerce_metadata(self.metadata)
        for name, kind in _METADATA_TYPES.items():
            v = self.metadata.get(name)
            if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
                raise TypeError(f"metadata.{name}={v!r}: expected {_KIND_NAMES[kind]}, got {type(v).__name__}")
        check_positive_ints(self, ("d_in", "d_sae"))  # k: its architecture checks it (BatchTopK's may be a float)
        check_bools(self, _BOOL_FIELDS, "JSON true or false")
        check_strings(self, ("architecture", "normalize_activations", "reshape_activations", "device"))
        self._check_architecture_fields()
        self.dtype = dtype_name(parse_dtype(self.dtype))
        if self.normalize_activations not in NORMALIZATIONS:
            raise ValueError(
                f"normalize_activations={self.normalize_activations!r}; expected one of {', '.join(NORMALIZATIONS)}"
            )
        scalers = FIELD_OWNERS.get("activation_normalization_factor", ())
        if self.normalize_activations == "constant_scalar_rescale" and self.architecture not in scalers:
            raise ValueError(
                f"normalize_activations='constant_scalar_rescale' is for {', '.join(scalers) or 'temporal'} SAEs "
                f"(it scales by their activation_normalization_factor), not a {self.architecture!r} one"
            )
        if self.reshape_activations not in ("none", "hook_z"):
            raise ValueError(f"reshape_activations={self.reshape_activations!r}; expected 'none' or 'hook_z'")

    def _check_architecture_fields(self) -> None:
        """Fill in the architecture's own fields' defaults; refuse another architecture's field by name."""
        arch = get_architecture(self.architecture)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, owners in FIELD_OWNERS.items():
            value = getattr(self, name)
            if name in arch.fields:
                if value is None:
                    setattr(self, name, arch.fields[name])
            elif value != defaults[name]:
                raise ValueError(
                    f"{name}={value!r} is a field of {', '.join(owners)} SAEs, not of a {self.architecture!r} one "
                    f"(leave it out, or set architecture to one of those)"
                )
        for f in dataclasses.fields(self):  # a field no registered architecture owns yet
            if f.name not in FIELD_OWNERS and f.name in _ARCH_FIELDS and getattr(self, f.name) != f.default:
                raise ValueError(f"{f.name}={getattr(self, f.name)!r}: no supported architecture has this field")
        arch.check_config(self)

    @property
    def architecture_module(self) -> Any:
        """The `Architecture` of `self.architecture` (interp_gpt.sae.saes.architectures)."""
        return get_architecture(self.architecture)

    @property
    def hook_name(self) -> str | None:
        """Where the SAE reads from: `metadata.hook_name` (e.g. "blocks.8.hook_resid_pre")."""
        name = self.metadata.get("hook_name")
        return name if isinstance(name, str) else None

    def to_dict(self) -> dict[str, Any]:
        """The cfg.json sae-lens 6 writes (and reads back as its own)."""
        fixed = {"apply_b_dec_to_input": self.apply_b_dec_to_input, "reshape_activations": self.reshape_activations}
        own = get_architecture(self.architecture).cfg_json_fields(self)
        return saelens_cfg_json(self, self.architecture, fixed, own, {})

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "cfg") -> SAEConfig:
        """Read a cfg.json's contents (6.x layout, or the pre-6.0 one converted as sae-lens does).
        Keys it does not know are kept in metadata when they come from a pre-6.0 file, else ignored."""
        d = saelens_cfg_dict(d, where)
        missing = [k for k in ("d_in", "d_sae") if k not in d]
        if missing:
            raise ValueError(f"{where}: missing field {missing[0]!r} (an SAE config needs d_in and d_sae)")
        nulls = [k for k in _BOOL_FIELDS if k in d and d[k] is None]
        if nulls:
            raise ValueError(f"{where}: {nulls[0]}=null: expected a boolean (JSON true or false)")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names and v is not None}
        return config_from_fields(cls, where, **kwargs)  # type: ignore[no-any-return]
