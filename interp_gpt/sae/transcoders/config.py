"""`TranscoderConfig`: a per-layer transcoder's shape and behaviour, every field checked once, here.

A transcoder reads one hook point (the MLP's input: `blocks.{l}.ln2.hook_normalized`, or
`blocks.{l}.hook_resid_mid` before the LayerNorm) and predicts another (the MLP's output,
`blocks.{l}.hook_mlp_out`). The two hook names live in `metadata` with sae-lens 6's keys,
`metadata.hook_name` (input) and `metadata.hook_name_out` (output):

    {"d_in": 768, "d_sae": 24576, "d_out": 768, "architecture": "jumprelu_skip_transcoder",
     "apply_b_dec_to_input": false, "metadata": {"hook_name": "blocks.8.ln2.hook_normalized",
     "hook_name_out": "blocks.8.hook_mlp_out", "model_name": "gpt2"}, ...}

The two formats this package reads disagree on one number: sae-lens' JumpReLU transcoder is
`ReLU(h) * (h > threshold)`, circuit-tracer's JumpReLU and TopK keep negative values
(`h * (h > threshold)`, the k largest `h` as they are). `nonnegative_acts` says which one a
transcoder computes; a file is read with its format's value and never written into a format whose
numbers would differ (see transcoder_io).

A BatchTopK transcoder is a JumpReLU transcoder trained another way (sae-lens' BatchTopK SAE saves
itself so): `architecture="jumprelu"` and `metadata.training_architecture="batchtopk"` with
`metadata.training_architecture_details={"k": k}` (`batchtopk_metadata(k)`), k features per row on
average over a batch (a number, may be a float). TranscoderTrainer then trains it as BatchTopK and sets
its threshold, one value for every feature, after each step; what it computes, saves and loads is the
JumpReLU. A CLT takes the same metadata (k per layer).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .. import common
from ..common import SAEMetadata

__all__ = [
    "TranscoderConfig",
    "TRANSCODER_ARCHITECTURES",
    "SAELENS_ARCHITECTURES",
    "PROCESSING_KEY",
    "PROCESSING_FLAGS",
    "parse_processing",
    "transcoder_shapes",
    "layer_of",
    "TranscoderFields",
    "TRAINING_ARCHITECTURES",
    "batchtopk_metadata",
    "batchtopk_k",
]

TRANSCODER_ARCHITECTURES = ("relu", "jumprelu", "topk")
# How a JumpReLU transcoder may be trained otherwise (metadata.training_architecture, sae-lens' key).
TRAINING_ARCHITECTURES = ("batchtopk",)
_TRAINING_KEY, _DETAILS_KEY = "training_architecture", "training_architecture_details"
# cfg.json's "architecture" -> (architecture, skip). The topk ones are this package's: sae-lens 6.54
# has no TopK transcoder class (it cannot load them); the other four are sae-lens' own names.
SAELENS_ARCHITECTURES = {
    "transcoder": ("relu", False),
    "skip_transcoder": ("relu", True),
    "jumprelu_transcoder": ("jumprelu", False),
    "jumprelu_skip_transcoder": ("jumprelu", True),
    "topk_transcoder": ("topk", False),
    "topk_skip_transcoder": ("topk", True),
}
# "expected_average_only_in" is the identity at inference in sae-lens 6 (the factor is folded into
# the weights); the other normalisations act on the input only, which a transcoder cannot undo.
_NORMALIZATIONS = ("none", "expected_average_only_in")
_BOOL_FIELDS = ("skip", "nonnegative_acts")
_METADATA_STR = ("hook_name", "hook_name_out", "model_name")
_LAYER = re.compile(r"^blocks\.(\d+)\.")
# metadata.model_processing: the weight processing of the model it was made for, the two steps that
# change its hooks (fold_ln: ln2.hook_normalized; center_writing_weights: hook_resid_mid and
# hook_mlp_out). A file that does not say is for raw weights, as circuit-tracer's and sae-lens' GPT-2
# transcoders are (circuit-tracer loads GPT-2 with fold_ln=False, center_writing_weights=False).
# sae-lens' metadata.model_from_pretrained_kwargs is not read for it: sae-lens passes those kwargs to
# from_pretrained when training and to from_pretrained_no_processing in its evals, so they do not say.
PROCESSING_KEY = "model_processing"
PROCESSING_FLAGS = ("fold_ln", "center_writing_weights")
_PROCESSING_NAMES = {"raw": (False, False), "processed": (True, True)}


def parse_processing(value: Any, where: str = "metadata.model_processing") -> dict[str, bool]:
    """{"fold_ln": bool, "center_writing_weights": bool} from such a dict, "raw" or "processed"
    (transformer-lens' from_pretrained defaults), or None (raw: what a file that does not say is for)."""
    if value is None:
        value = "raw"
    if isinstance(value, str):
        if value not in _PROCESSING_NAMES:
            raise ValueError(
                f"{where}={value!r}: expected 'raw', 'processed' or a dict of {', '.join(PROCESSING_FLAGS)} (booleans)"
            )
        return dict(zip(PROCESSING_FLAGS, _PROCESSING_NAMES[value], strict=True))
    if not isinstance(value, dict):
        raise TypeError(f"{where}={value!r}: expected 'raw', 'processed' or a dict, got {type(value).__name__}")
    unknown = [k for k in value if k not in PROCESSING_FLAGS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), PROCESSING_FLAGS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r}{hint} (expected {', '.join(PROCESSING_FLAGS)}: the steps "
            "that change a transcoder's hooks)"
        )
    missing = [k for k in PROCESSING_FLAGS if k not in value]
    if missing:
        raise ValueError(f"{where}={value!r}: missing {missing[0]!r}; give both {' and '.join(PROCESSING_FLAGS)}")
    for k in PROCESSING_FLAGS:
        if not isinstance(value[k], bool):
            raise TypeError(
                f"{where}.{k}={value[k]!r}: expected a boolean (true / false), got {type(value[k]).__name__}"
            )
    return {k: value[k] for k in PROCESSING_FLAGS}


def batchtopk_metadata(k: float) -> dict[str, Any]:
    """The metadata keys that make a JumpReLU transcoder (or CLT) train as BatchTopK, `k` features per
    row on average over a batch (per layer for a CLT); its config checks k against d_sae.

    Example:
        >>> meta = {"hook_name": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out"}
        >>> cfg = TranscoderConfig(d_in=128, d_sae=512, d_out=128, architecture="jumprelu",
        ...                        metadata={**meta, **batchtopk_metadata(8.5)})
        >>> batchtopk_k(cfg)
        8.5
    """
    return {_TRAINING_KEY: "batchtopk", _DETAILS_KEY: {"k": _check_batch_k(k, None, "k")}}


def batchtopk_k(cfg: Any) -> float | None:
    """The k a transcoder's (or CLT's) config trains BatchTopK with (metadata.training_architecture_details.k),
    or None when its metadata says no BatchTopK training. A JumpReLU whose metadata names another TopK-family
    training (sae-lens' "matryoshka_batchtopk" ...), which this package does not train, is refused by name."""
    how = cfg.metadata.get(_TRAINING_KEY)
    if how in TRAINING_ARCHITECTURES:
        return float(cfg.metadata[_DETAILS_KEY]["k"])
    if cfg.architecture == "jumprelu" and isinstance(how, str) and "topk" in how:
        raise ValueError(
            f"metadata.{_TRAINING_KEY}={how!r}: a JumpReLU trained as {how}, which TranscoderTrainer does not "
            f"train (it trains {', '.join(TRAINING_ARCHITECTURES)}); set it to 'batchtopk' with "
            f"{_DETAILS_KEY}={{'k': k}} (batchtopk_metadata(k)), or remove it to train the JumpReLU's own loss"
        )
    return None


def _check_batch_k(k: Any, d_sae: int | None, where: str) -> float | int:
    """BatchTopK's k: a number > 0 (and <= d_sae when given); an int stays an int."""
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        raise TypeError(f"{where}={k!r}: expected a number > 0 (features per row on average), got {type(k).__name__}")
    high = f" and <= d_sae={d_sae}" if d_sae is not None else ""
    if not math.isfinite(k) or k <= 0 or (d_sae is not None and k > d_sae):
        raise ValueError(f"{where}={k!r}: expected a number > 0{high} (BatchTopK's features per row on average)")
    return k


def _check_training(cfg: TranscoderConfig) -> None:
    """metadata.training_architecture="batchtopk": on a JumpReLU, with a good k. (Another value is a
    file's history, as sae-lens writes it for every trained SAE: kept, not read.)"""
    how = cfg.metadata.get(_TRAINING_KEY)
    if how not in TRAINING_ARCHITECTURES:
        return
    if cfg.architecture != "jumprelu":
        raise ValueError(
            f"metadata.{_TRAINING_KEY}={how!r} trains a JumpReLU transcoder (its threshold is the running one); "
            f"architecture={cfg.architecture!r}: expected 'jumprelu'"
        )
    details = cfg.metadata.get(_DETAILS_KEY)
    if not isinstance(details, dict) or "k" not in details:
        raise ValueError(
            f"metadata.{_DETAILS_KEY}={details!r}: a {how} transcoder needs {{'k': features per row on average}}"
        )
    _check_batch_k(details["k"], cfg.d_sae, f"metadata.{_DETAILS_KEY}.k")


def layer_of(hook: str | None) -> int | None:
    """The block a hook name belongs to ("blocks.3.hook_mlp_out" -> 3), None for any other name."""
    m = _LAYER.match(hook) if isinstance(hook, str) else None
    return int(m.group(1)) if m else None


class TranscoderFields(common.ConfigDtype):
    """What TranscoderConfig and CLTConfig read alike from their metadata: the model and its weights."""

    metadata: SAEMetadata

    @property
    def model_name(self) -> str | None:
        """The model it was trained on (`metadata.model_name`), or None."""
        v = self.metadata.get("model_name")
        return v if isinstance(v, str) else None

    @property
    def processing(self) -> dict[str, bool]:
        """The weight processing of the model it is for: metadata.model_processing, e.g.
        {"fold_ln": False, "center_writing_weights": False} (raw weights, the default)."""
        return dict(self.metadata[PROCESSING_KEY])


@dataclass
class TranscoderConfig(TranscoderFields):
    """A per-layer transcoder's widths, activation, skip connection and hook points.

    Example (tiny-gpt2: the MLP reads and writes d_model = 128):
        >>> cfg = TranscoderConfig(d_in=128, d_sae=512, d_out=128, architecture="topk", k=16, skip=True,
        ...                        metadata={"hook_name": "blocks.1.ln2.hook_normalized",
        ...                                  "hook_name_out": "blocks.1.hook_mlp_out"})
        >>> cfg.input_hook, cfg.output_hook, cfg.layer
        ('blocks.1.ln2.hook_normalized', 'blocks.1.hook_mlp_out', 1)
    """

    d_in: int  # the width it reads (d_model for the MLP's input)
    d_sae: int  # the number of features
    d_out: int  # the width it writes (d_model for the MLP's output)
    architecture: str = "relu"  # "relu", "jumprelu" (a threshold per feature) or "topk" (k per token)
    skip: bool = False  # a linear skip connection W_skip [d_out, d_in], added as x @ W_skip.T
    k: int | None = None  # topk only: the features kept per token (required there, refused elsewhere)
    # jumprelu / topk: clamp the kept activations at 0 (sae-lens' JumpReLU transcoder, True) or keep
    # negative values (circuit-tracer's JumpReLU and TopK, False). "relu" is non-negative by definition.
    nonnegative_acts: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    normalize_activations: str = "none"  # "none" (or sae-lens' "expected_average_only_in", the same here)
    metadata: SAEMetadata = field(default_factory=SAEMetadata)

    def __post_init__(self) -> None:
        # Every field's type first (a JSON "false" is truthy), then its value, each error naming the field.
        self.metadata = common.coerce_metadata(self.metadata)
        for name in _METADATA_STR:
            v = self.metadata.get(name)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"metadata.{name}={v!r}: expected a string, got {type(v).__name__}")
        self.metadata[PROCESSING_KEY] = parse_processing(self.metadata.get(PROCESSING_KEY))
        common.check_positive_ints(self, ("d_in", "d_sae", "d_out", "k"))
        common.check_bools(self, _BOOL_FIELDS, "True / False, JSON true / false")
        common.check_strings(self, ("architecture", "normalize_activations", "device"))
        if self.architecture not in TRANSCODER_ARCHITECTURES:
            hint = ""
            if self.architecture in TRAINING_ARCHITECTURES:
                hint = (
                    f" ({self.architecture!r} is how a JumpReLU transcoder is trained: pass architecture='jumprelu' "
                    f"and metadata with batchtopk_metadata(k), i.e. {_TRAINING_KEY}={self.architecture!r}, "
                    f"{_DETAILS_KEY}={{'k': k}})"
                )
            elif self.architecture in SAELENS_ARCHITECTURES:
                arch, skip = SAELENS_ARCHITECTURES[self.architecture]
                hint = f" ({self.architecture!r} is sae-lens' file name for architecture={arch!r}, skip={skip})"
            raise ValueError(
                f"architecture={self.architecture!r} is not a transcoder architecture; expected one of "
                f"{', '.join(TRANSCODER_ARCHITECTURES)}{hint}"
            )
        if self.architecture == "topk":
            if self.k is None:
                raise ValueError("k: a topk transcoder needs k (the features kept per token), e.g. k=32")
            if self.k > self.d_sae:
                raise ValueError(f"k={self.k}: expected an integer in 1..d_sae={self.d_sae}")
        elif self.k is not None:
            raise ValueError(
                f"k={self.k!r}: only a topk transcoder keeps k features; architecture={self.architecture!r}"
            )
        _check_training(self)
        if self.architecture == "relu" and not self.nonnegative_acts:
            raise ValueError("nonnegative_acts=False: a relu transcoder's activations are non-negative by definition")
        self.dtype = common.dtype_name(common.parse_dtype(self.dtype))
        if self.normalize_activations not in _NORMALIZATIONS:
            raise ValueError(
                f"normalize_activations={self.normalize_activations!r} is not supported for transcoders "
                f"(it rescales the input only); expected one of {', '.join(_NORMALIZATIONS)}"
            )
        lin, lout = layer_of(self.input_hook), layer_of(self.output_hook)
        if lin is not None and lout is not None and lin != lout:
            raise ValueError(
                f"metadata.hook_name_out={self.output_hook!r} is in layer {lout} but metadata.hook_name="
                f"{self.input_hook!r} in layer {lin}: a per-layer transcoder reads and writes one layer"
            )

    # ----- the hook points and widths the splice needs ---------------------------------
    @property
    def input_hook(self) -> str | None:
        """The hook it reads: `metadata.hook_name` (e.g. "blocks.1.ln2.hook_normalized")."""
        v = self.metadata.get("hook_name")
        return v if isinstance(v, str) else None

    @property
    def output_hook(self) -> str | None:
        """The hook it predicts: `metadata.hook_name_out` (e.g. "blocks.1.hook_mlp_out")."""
        v = self.metadata.get("hook_name_out")
        return v if isinstance(v, str) else None

    hook_name = input_hook  # SAEConfig's name for where it reads

    @property
    def layer(self) -> int | None:
        """The block of its hooks ("blocks.1...." -> 1), None when no hook names a block."""
        lin = layer_of(self.input_hook)
        return lin if lin is not None else layer_of(self.output_hook)

    @property
    def saelens_architecture(self) -> str:
        """The "architecture" of its sae-lens cfg.json ("skip_transcoder", "jumprelu_transcoder", ...)."""
        return next(name for name, v in SAELENS_ARCHITECTURES.items() if v == (self.architecture, self.skip))

    # ----- sae-lens' cfg.json -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The cfg.json sae-lens 6 writes for a transcoder (and reads back as its own, but for TopK)."""
        # sae-lens refuses apply_b_dec_to_input=True for transcoders (b_dec is d_out wide)
        fixed = {"apply_b_dec_to_input": False, "reshape_activations": "none"}
        topk = {"k": self.k, "nonnegative_acts": self.nonnegative_acts}
        return common.saelens_cfg_json(self, self.saelens_architecture, fixed, {"d_out": self.d_out}, topk)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "cfg") -> TranscoderConfig:
        """Read a sae-lens transcoder cfg.json's contents (pre-6.0 layouts converted as sae-lens does).
        A JumpReLU file reads with nonnegative_acts=True: sae-lens' JumpReLU transcoder applies a ReLU."""
        d = common.saelens_cfg_dict(d, where)
        arch = d.get("architecture")
        if arch not in SAELENS_ARCHITECTURES:
            raise ValueError(
                f"{where}: architecture={arch!r} is not a transcoder; expected one of {', '.join(SAELENS_ARCHITECTURES)}"
            )
        missing = [k for k in ("d_in", "d_sae", "d_out") if k not in d]
        if missing:
            raise ValueError(f"{where}: missing field {missing[0]!r} (a transcoder config needs d_in, d_sae and d_out)")
        b_dec_in = d.get("apply_b_dec_to_input", False)
        if b_dec_in is not False:
            raise ValueError(
                f"{where}: apply_b_dec_to_input={b_dec_in!r}: a transcoder's b_dec is its output's bias; "
                "expected false (sae-lens refuses true for transcoders too)"
            )
        reshape = d.get("reshape_activations", "none")
        if reshape != "none":
            raise ValueError(f"{where}: reshape_activations={reshape!r}: transcoders read unreshaped activations")
        architecture, skip = SAELENS_ARCHITECTURES[arch]
        names = {f.name for f in dataclasses.fields(cls)} - {"architecture", "skip"}
        kwargs = {k: v for k, v in d.items() if k in names and v is not None}
        if architecture != "topk":
            kwargs.pop("nonnegative_acts", None)  # sae-lens' JumpReLU transcoder clamps at 0: True
        return common.config_from_fields(cls, where, architecture=architecture, skip=skip, **kwargs)  # type: ignore[no-any-return]


def transcoder_shapes(cfg: TranscoderConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a transcoder of this config holds, with sae-lens' names and shapes."""
    shapes: dict[str, tuple[int, ...]] = {
        "W_enc": (cfg.d_in, cfg.d_sae),
        "W_dec": (cfg.d_sae, cfg.d_out),
        "b_enc": (cfg.d_sae,),
        "b_dec": (cfg.d_out,),
    }
    if cfg.skip:
        shapes["W_skip"] = (cfg.d_out, cfg.d_in)
    if cfg.architecture == "jumprelu":
        shapes["threshold"] = (cfg.d_sae,)
    return shapes
