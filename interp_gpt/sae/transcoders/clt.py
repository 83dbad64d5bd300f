"""`CrossLayerTranscoder` (CLT): each layer's features read that layer's MLP input and write into the
MLP outputs of that layer and every later one.

    encode, layer l:  f_l = act(x_l @ W_enc[l] + b_enc[l])                          # [..., d_sae]
    decode, layer m:  y_m = b_dec[m] + sum_{l <= m} f_l @ W_dec[l][:, m - l]  (+ x_m @ W_skip[m].T)

`W_dec[l]` is [d_sae, n_layers - l, d_out]: layer l's decoders into layers l, l+1, ... (circuit-tracer's
layout). The activations are a PLT's (see transcoder.activate). Each layer has the SAE's hook points
under `layers.{l}` (`layers.{l}.hook_sae_acts_post` ...). `with model.transcoders(clt)` splices it as one
view per layer (`splice_parts()`, see clt_splice): view l reads layer l's input at `clt.input_hook(l)`,
encodes it once per pass, and writes layer l's prediction at `clt.output_hook(l)` from the features of
layers 0..l of that pass; spliced, layer l's hook points are `blocks.l.hook_mlp_out.hook_sae_*`.

Files: circuit-tracer's CLT folder (read from safety-research/circuit-tracer's
`transcoder/cross_layer_transcoder.py` and `utils/hf_utils.py`): `config.yaml` with
`model_kind: cross_layer_transcoder`, `feature_input_hook`, `feature_output_hook`; per layer i
`W_enc_{i}.safetensors` (W_enc_i [d_sae, d_in], b_enc_i, b_dec_i, optional threshold_i) and
`W_dec_{i}.safetensors` (W_dec_i [d_sae, n_layers - i, d_out]). Its JumpReLU keeps negative values;
it has no TopK and stores no skip. A CLT circuit-tracer cannot compute exactly (TopK, a skip, a ReLU'd
JumpReLU with negative thresholds) is written with `model_kind: interp_gpt.cross_layer_transcoder`
(plus `activation`, `k` and `W_skip_{i}`), which circuit-tracer refuses rather than misreads.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ...checkpoints.sources import CheckpointError
from ...files import atomic_folder, atomic_path
from ...hooks import HookPoint
from ..common import (
    CoderWeights,
    SAEMetadata,
    cast_state,
    check_init_seed,
    check_tensors,
    dtype_name,
    identity,
    load_built,
    read_safetensors,
    zero_if_present,
)
from ..mapped import FileWeight, MappedState, map_safetensors, record_file_weights
from ..names import set_model_name
from .config import TranscoderConfig, TranscoderFields
from .folders import CLT_EXT_KIND, CLT_KIND, check_replaceable
from .io import CT_CONFIG_FILENAME, SCAN_KEY, check_scan, save_safetensors
from .splice import CLTLayer
from .transcoder import activate, lazy_on

__all__ = ["CrossLayerTranscoder", "CLTConfig", "load_clt", "save_clt"]

_HOOK_NAMES = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_output")


@dataclass
class CLTConfig(TranscoderFields):
    """A cross-layer transcoder's shape: n_layers, and a PLT's fields for each layer (checked as
    TranscoderConfig checks them). `metadata.hook_name` / `hook_name_out` are relative to blocks.L
    ("ln2.hook_normalized", "hook_mlp_out"), as circuit-tracer's feature_input_hook / feature_output_hook.

    Example (tiny-gpt2: 2 layers, MLPs 128 wide):
        >>> cfg = CLTConfig(n_layers=2, d_in=128, d_sae=256, d_out=128, architecture="topk", k=16,
        ...                 metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"})
        >>> cfg.input_hook(1), cfg.output_hook(1)
        ('blocks.1.ln2.hook_normalized', 'blocks.1.hook_mlp_out')
    """

    n_layers: int
    d_in: int
    d_sae: int  # features per layer
    d_out: int
    architecture: str = "relu"
    skip: bool = False
    k: int | None = None
    nonnegative_acts: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    metadata: SAEMetadata = field(default_factory=SAEMetadata)

    def __post_init__(self) -> None:
        if isinstance(self.n_layers, bool) or not isinstance(self.n_layers, int):
            raise TypeError(
                f"n_layers={self.n_layers!r}: expected a positive integer, got {type(self.n_layers).__name__}"
            )
        if self.n_layers < 1:
            raise ValueError(f"n_layers={self.n_layers!r}: expected a positive integer")
        # The per-layer fields are a PLT's: TranscoderConfig checks them (and names them) once.
        plt = TranscoderConfig(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "n_layers"}
        )
        self.metadata, self.dtype, self.device = plt.metadata, plt.dtype, plt.device
        for key in ("hook_name", "hook_name_out"):
            v = self.metadata.get(key)
            if isinstance(v, str) and v.startswith("blocks.") and "{layer}" not in v:
                raise ValueError(
                    f"metadata.{key}={v!r}: a CLT reads and writes every layer; give the name relative to "
                    "blocks.L (e.g. 'ln2.hook_normalized') or a template 'blocks.{layer}....'"
                )

    def _hook(self, key: str, layer: int) -> str | None:
        rel = self.metadata.get(key)
        if not isinstance(rel, str):
            return None
        return rel.format(layer=layer) if "{layer}" in rel else f"blocks.{layer}.{rel}"

    def input_hook(self, layer: int) -> str | None:
        """The model hook layer `layer`'s encoder reads, e.g. "blocks.1.ln2.hook_normalized"."""
        return self._hook("hook_name", layer)

    def output_hook(self, layer: int) -> str | None:
        """The model hook the decoders into layer `layer` write, e.g. "blocks.1.hook_mlp_out"."""
        return self._hook("hook_name_out", layer)


class _LayerHooks(nn.Module):
    """One layer's hook points, with the SAE's names (hook_sae_error: the error term's, while spliced)."""

    def __init__(self) -> None:
        super().__init__()
        for name in _HOOK_NAMES + ("hook_sae_error",):
            setattr(self, name, HookPoint())


class CrossLayerTranscoder(CoderWeights, nn.Module):
    """A cross-layer transcoder over `n_layers` layers (see the module's docs for the maths).

    Example (tiny-gpt2's shapes):
        >>> clt = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=128, d_sae=256, d_out=128,
        ...     metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"}))
        >>> xs = torch.randn(2, 3, 5, 128)          # [n_layers, batch, pos, d_in]: each layer's MLP input
        >>> acts = clt.encode(xs)                    # [2, 3, 5, 256]
        >>> clt.decode(acts).shape                   # every layer's predicted MLP output
        torch.Size([2, 3, 5, 128])
        >>> clt.decode_layer(acts[:2], 1).shape      # layer 1's, from the features of layers 0 and 1
        torch.Size([3, 5, 128])
    """

    def __init__(self, cfg: CLTConfig | dict[str, Any]):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = CLTConfig(**cfg)
        if not isinstance(cfg, CLTConfig):
            raise TypeError(f"cfg: expected a CLTConfig (or its fields as a dict), got {type(cfg).__name__}")
        self.cfg = cfg
        n, dtype, device = cfg.n_layers, cfg.torch_dtype, torch.device(cfg.device)

        def zeros(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))

        self.W_enc = zeros(n, cfg.d_in, cfg.d_sae)
        self.b_enc = zeros(n, cfg.d_sae)
        self.W_dec = nn.ParameterList([zeros(cfg.d_sae, n - i, cfg.d_out) for i in range(n)])  # into layers i..n-1
        self.b_dec = zeros(n, cfg.d_out)
        if cfg.skip:
            self.W_skip = zeros(n, cfg.d_out, cfg.d_in)
        if cfg.architecture == "jumprelu":
            self.threshold = zeros(n, cfg.d_sae)
        self.layers = nn.ModuleList([_LayerHooks() for _ in range(n)])
        for i, hooks in enumerate(self.layers):
            for name in _HOOK_NAMES + ("hook_sae_error",):
                getattr(hooks, name).name = f"layers.{i}.{name}"
        if device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Kaiming-uniform encoders and decoders (as a PLT's), zero biases, skips and thresholds."""
        check_init_seed(seed)
        gen = torch.Generator(device=self.W_enc.device).manual_seed(seed) if seed is not None else None
        for p in [self.W_enc, *self.W_dec]:
            bound = (6.0 / p.shape[-1]) ** 0.5
            p.copy_((torch.rand(p.shape, generator=gen, device=p.device) * 2 - 1) * bound)
        zero_if_present(self, ("b_enc", "b_dec", "W_skip", "threshold"))

    @property
    def n_layers(self) -> int:
        """The layers it reads from (one encoder each)."""
        return self.cfg.n_layers

    # (dtype, device: CoderWeights')

    def input_hook(self, layer: int) -> str | None:
        """The hook that layer `layer`'s encoder reads."""
        return self.cfg.input_hook(layer)

    def output_hook(self, layer: int) -> str | None:
        """The hook that layer `layer`'s decoders write."""
        return self.cfg.output_hook(layer)

    def _hp(self, layer: int, name: str) -> HookPoint:
        """Layer `layer`'s hook point `name` (e.g. "hook_sae_acts_post")."""
        hp = getattr(self.layers[layer], name)
        assert isinstance(hp, HookPoint)
        return hp

    @property
    def hook_names(self) -> tuple[str, ...]:
        """Each layer's hook point names (under `layers.{l}.`)."""
        return _HOOK_NAMES

    def _layer(self, layer: Any, caller: str) -> int:
        try:  # an int, a numpy int or a 0-d integer tensor
            index = None if isinstance(layer, bool) else operator.index(layer)
        except TypeError:
            index = None
        if index is None or not 0 <= index < self.n_layers:
            raise ValueError(f"{caller}: layer={layer!r}; the CLT's layers are 0..{self.n_layers - 1}")
        return index

    def _check(self, t: Any, arg: str, width: int, axis: str, caller: str, lead: int = 0) -> Tensor:
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{caller}: {arg}: expected a float tensor [..., {axis}={width}], got {type(t).__name__}")
        if t.ndim < 1 + lead or t.shape[-1] != width:
            want = "[n_layers, ..., " if lead else "[..., "
            raise ValueError(f"{caller}: {arg} has shape {tuple(t.shape)}; expected {want}{axis}={width}]")
        return t.to(self.dtype)

    # ----- one layer at a time (what a splice calls) ---------------------------------------
    def encode_layer(self, x: Float[Tensor, "... d_in"], layer: int) -> Float[Tensor, "... d_sae"]:
        """Layer `layer`'s feature activations from its input `x`."""
        layer = self._layer(layer, "CrossLayerTranscoder.encode_layer")
        return self._encode(self._check(x, "x", self.cfg.d_in, "d_in", "CrossLayerTranscoder.encode_layer"), layer)

    def _encode(self, x: Tensor, layer: int, hooked: bool = True) -> Tensor:
        """encode_layer's arithmetic on checked input; `hooked=False` past the hook points."""
        hp = self._hooks(layer, hooked)
        pre = hp("hook_sae_acts_pre")(hp("hook_sae_input")(x) @ self.W_enc[layer] + self.b_enc[layer])
        threshold = self.threshold[layer] if self.cfg.architecture == "jumprelu" else None
        return hp("hook_sae_acts_post")(activate(pre, self.cfg, threshold))

    def _hooks(self, layer: int, hooked: bool) -> Any:
        return (lambda name: self._hp(layer, name)) if hooked else (lambda name: identity)

    def decode_layer(
        self, acts: Float[Tensor, "src ... d_sae"], layer: int, x: Float[Tensor, "... d_in"] | None = None
    ) -> Float[Tensor, "... d_out"]:
        """Layer `layer`'s predicted output from the activations of layers 0..layer (`acts[l]` for
        l <= layer; `acts` may hold more layers) and, with a skip, layer `layer`'s input `x`."""
        caller = "CrossLayerTranscoder.decode_layer"
        layer = self._layer(layer, caller)
        acts = self._check(acts, "acts", self.cfg.d_sae, "d_sae", caller, lead=1)
        if acts.shape[0] < layer + 1:
            raise ValueError(f"{caller}: acts holds {acts.shape[0]} layers; layer {layer} needs layers 0..{layer}")
        if self.cfg.skip:
            if x is None:
                raise ValueError(f"{caller}: x: a skip CLT adds x @ W_skip[layer].T; pass layer {layer}'s input")
            x = self._check(x, "x", self.cfg.d_in, "d_in", caller)
        return self._decode(acts, layer, x)

    def _decode(self, acts: Any, layer: int, x: Tensor | None, hooked: bool = True) -> Tensor:
        """decode_layer's arithmetic on checked input (`acts[s]` for s <= layer: a stacked tensor or a
        list); `hooked=False` past the hook points."""
        out = self.b_dec[layer] + sum(acts[s] @ self.W_dec[s][:, layer - s] for s in range(layer + 1))
        if self.cfg.skip:
            assert x is not None
            out = out + x @ self.W_skip[layer].T
        return self._hooks(layer, hooked)("hook_sae_recons")(out)

    # ----- every layer at once -------------------------------------------------------------------
    def encode(self, xs: Float[Tensor, "n_layers ... d_in"]) -> Float[Tensor, "n_layers ... d_sae"]:
        """Every layer's feature activations from every layer's input (stacked on the first axis)."""
        xs = self._check(xs, "xs", self.cfg.d_in, "d_in", "CrossLayerTranscoder.encode", lead=1)
        if xs.shape[0] != self.n_layers:
            raise ValueError(
                f"CrossLayerTranscoder.encode: xs holds {xs.shape[0]} layers; expected n_layers={self.n_layers}"
            )
        return torch.stack([self.encode_layer(xs[i], i) for i in range(self.n_layers)])

    def decode(
        self, acts: Float[Tensor, "n_layers ... d_sae"], xs: Float[Tensor, "n_layers ... d_in"] | None = None
    ) -> Float[Tensor, "n_layers ... d_out"]:
        """Every layer's predicted output (with a skip, from every layer's input `xs` too)."""
        if self.cfg.skip and xs is None:
            raise ValueError("CrossLayerTranscoder.decode: xs: a skip CLT needs every layer's input, decode(acts, xs)")
        return torch.stack([self.decode_layer(acts, m, None if xs is None else xs[m]) for m in range(self.n_layers)])

    def forward(self, xs: Float[Tensor, "n_layers ... d_in"]) -> Float[Tensor, "n_layers ... d_out"]:
        """decode(encode(xs), xs), each layer's through its `hook_sae_output`."""
        out = self.decode(self.encode(xs), xs if self.cfg.skip else None)
        return torch.stack([self._hp(m, "hook_sae_output")(out[m]) for m in range(self.n_layers)])

    def splice_parts(self) -> list[CLTLayer]:
        """What `model.transcoders(clt)` splices: one view per layer (see interp_gpt.sae.clt_splice), each
        reading `input_hook(l)` and writing `output_hook(l)` from the features of layers 0..l of that pass."""
        views = self.__dict__.get("_splice_views")
        if views is None:
            views = self.__dict__["_splice_views"] = [CLTLayer(self, i) for i in range(self.n_layers)]
        return list(views)

    def converted_to(self, model: Any, copy: bool = True) -> CrossLayerTranscoder:
        """A new CLT computing on `model`'s weights exactly what this one computes on the weights it was made
        for (cfg.metadata.model_processing), layer by layer as `Transcoder.converted_to`; a ValueError
        naming the layer, the hook and why where no exact conversion exists. `copy=False`: this CLT itself
        where nothing needs converting (the checks still run)."""
        from .processing import clt_plans, convert_clt_state

        plans = clt_plans(self, model, "CrossLayerTranscoder.converted_to")
        if not copy and all(p.identity for p in plans) and self.cfg.metadata.get("hook_name") != "mlp.hook_in":
            return self
        meta = SAEMetadata(self.cfg.metadata)
        meta["model_processing"] = dict(plans[0].processing)
        if meta.get("hook_name") == "mlp.hook_in":  # read where the model has it, mapped exactly
            meta["hook_name"] = "ln2.hook_normalized"
        cfg = dataclasses.replace(self.cfg, metadata=meta, device="meta")
        state = convert_clt_state(self.state_dict(), plans, self.cfg.skip)
        return load_built(CrossLayerTranscoder, cfg, state, self.device)  # type: ignore[no-any-return]

    def extra_repr(self) -> str:
        """Its shape and hooks, in `repr`."""
        c = self.cfg
        extra = (f", k={c.k}" if c.architecture == "topk" else "") + (", skip" if c.skip else "")
        return f"{c.architecture}, n_layers={c.n_layers}, d_in={c.d_in}, d_sae={c.d_sae}, d_out={c.d_out}{extra}"


# ----------------------------------------------------------------------------------------------
# Files: circuit-tracer's CLT folder
# ----------------------------------------------------------------------------------------------
def _exact_in_circuit_tracer(clt: CrossLayerTranscoder) -> bool:
    c = clt.cfg
    if c.architecture == "topk" or c.skip:
        return False
    return not (c.architecture == "jumprelu" and c.nonnegative_acts and bool((clt.threshold < 0).any()))


def save_clt(clt: CrossLayerTranscoder, path: str | Path) -> Path:
    """Write `clt` as circuit-tracer's CLT folder (see the module's docs), whole or not at all.

    Example:
        >>> from interp_gpt.sae.data import shipped_clt
        >>> save_clt(shipped_clt(), "transcoders/tiny-gpt2-clt")
        PosixPath('transcoders/tiny-gpt2-clt')
    """

    import yaml

    if not isinstance(clt, CrossLayerTranscoder):
        raise TypeError(f"save_clt: clt: expected a CrossLayerTranscoder, got {type(clt).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"save_clt: path: expected a folder path, got {type(path).__name__}")
    c = clt.cfg
    for key in ("hook_name", "hook_name_out"):
        if not isinstance(c.metadata.get(key), str):
            raise ValueError(f"save_clt: clt.cfg.metadata.{key} is not set: circuit-tracer's config names both hooks")
    target = Path(path).expanduser()
    try:  # only a CLT folder is replaced, by what its files say
        check_replaceable(target, "clt")
    except FileExistsError as e:
        raise FileExistsError(f"save_clt: {e}") from None
    exact = _exact_in_circuit_tracer(clt)
    config: dict[str, Any] = {"model_name": c.model_name} if c.model_name else {}
    config.update(model_kind=CLT_KIND if exact else CLT_EXT_KIND, feature_input_hook=c.metadata["hook_name"])
    config["feature_output_hook"] = c.metadata["hook_name_out"]
    config["model_processing"] = c.metadata["model_processing"]  # the weights it is for (circuit-tracer ignores it)
    if c.metadata.get(SCAN_KEY) is not None:
        config[SCAN_KEY] = c.metadata[SCAN_KEY]
    if not exact:
        config.update(activation=c.architecture, nonnegative_acts=c.nonnegative_acts)
        if c.architecture == "topk":
            config["k"] = c.k
    with atomic_folder(target) as tmp:
        for i in range(c.n_layers):
            enc = {f"W_enc_{i}": clt.W_enc[i].T, f"b_enc_{i}": clt.b_enc[i], f"b_dec_{i}": clt.b_dec[i]}
            if c.architecture == "jumprelu":
                enc[f"threshold_{i}"] = clt.threshold[i]
            if c.skip:
                enc[f"W_skip_{i}"] = clt.W_skip[i]
            save_safetensors(tmp / f"W_enc_{i}.safetensors", enc, {})
            save_safetensors(tmp / f"W_dec_{i}.safetensors", {f"W_dec_{i}": clt.W_dec[i]}, {})
        with atomic_path(tmp / CT_CONFIG_FILENAME) as t:
            t.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


def load_clt(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    model_name: str | None = None,
    lazy: bool | None = None,
) -> CrossLayerTranscoder:
    """Load circuit-tracer's CLT folder (its config.yaml, or the folder), every tensor checked first.
    `model_name` (e.g. "my-gpt2", a local copy of GPT-2) records the model it is for in its
    metadata.model_name, in place of the file's (None: the file's own). `lazy` (None or True; False off
    the CPU): the decoders (the bulk: n_layers (n_layers + 1) / 2 matrices) stay memory-mapped from their files, read
    only where used, as `load_transcoders(lazy=True)` keeps a PLT's; the encoders are read now (one stacked
    tensor; every position's pre-activations need all of them).

    Example:
        >>> from interp_gpt.sae.data import shipped_clt
        >>> folder = save_clt(shipped_clt(), "transcoders/tiny-gpt2-clt")
        >>> clt = load_clt("transcoders/tiny-gpt2-clt")
    """
    import yaml

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load_clt: path: expected a folder or its config.yaml, got {type(path).__name__}")
    p = Path(path).expanduser()
    cfg_path = p / CT_CONFIG_FILENAME if p.is_dir() else p
    if not cfg_path.is_file():
        raise FileNotFoundError(f"load_clt: {str(cfg_path)!r} does not exist (a CLT folder holds {CT_CONFIG_FILENAME})")
    try:
        config = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path}: not valid YAML ({e})") from e
    if not isinstance(config, dict) or config.get("model_kind") not in (CLT_KIND, CLT_EXT_KIND):
        kind = config.get("model_kind") if isinstance(config, dict) else config
        raise CheckpointError(
            f"{cfg_path}: model_kind={kind!r}; expected {CLT_KIND!r} (a per-layer set loads with load_transcoders)"
        )
    folder = cfg_path.parent
    mapped = lazy_on(lazy, device, dtype, "load_clt")
    n = len([q for q in folder.iterdir() if re.match(r"^W_enc_\d+\.safetensors$", q.name)])
    if n == 0:
        raise CheckpointError(f"{cfg_path}: {folder} holds no W_enc_<i>.safetensors")
    enc: list[dict[str, Tensor]] = []
    dec: list[dict[str, Tensor]] = []
    for i in range(n):
        for name, out in ((f"W_enc_{i}", enc), (f"W_dec_{i}", dec)):
            file = folder / f"{name}.safetensors"
            if not file.is_file():
                raise CheckpointError(
                    f"{cfg_path}: layer {i}'s {file.name} is missing ({n} W_enc files: layers 0..{n - 1})"
                )
            if mapped is not False and name.startswith("W_dec"):
                out.append(MappedState(map_safetensors(file)[0], {name: FileWeight(str(file), name)}))
            else:
                out.append(read_safetensors(file, device)[0])
    w0 = enc[0].get("W_enc_0")
    if w0 is None or w0.ndim != 2:
        raise CheckpointError(f"{folder / 'W_enc_0.safetensors'}: W_enc_0 must be [d_sae, d_in]")
    ext = config["model_kind"] == CLT_EXT_KIND
    arch = config.get("activation", "relu") if ext else ("jumprelu" if "threshold_0" in enc[0] else "relu")
    for key in ("feature_input_hook", "feature_output_hook"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise CheckpointError(f"{cfg_path}: {key}={config.get(key)!r}: expected a hook name relative to blocks.L")
    b_dec0 = enc[0].get("b_dec_0")  # its absence is named by the tensor check below
    fields: dict[str, Any] = dict(
        n_layers=n,
        d_in=int(w0.shape[1]),
        d_sae=int(w0.shape[0]),
        d_out=int(b_dec0.shape[-1]) if b_dec0 is not None and b_dec0.ndim else 1,
        architecture=arch,
        skip="W_skip_0" in enc[0],
        k=config.get("k") if ext else None,
        # circuit-tracer's JumpReLU keeps negative values; our extension says what it computes
        nonnegative_acts=config.get("nonnegative_acts", arch == "relu") if ext else arch == "relu",
        dtype=dtype_name(w0.dtype) if w0.is_floating_point() else "float32",
        metadata={"hook_name": config["feature_input_hook"], "hook_name_out": config["feature_output_hook"]},
    )
    if isinstance(config.get("model_name"), str):
        fields["metadata"]["model_name"] = config["model_name"]
    set_model_name(fields["metadata"], model_name, "load_clt")
    scan = check_scan(config.get(SCAN_KEY), cfg_path)
    if scan is not None:  # circuit-tracer's name of the CLT (a graph's metadata.scan): kept, as it does
        fields["metadata"][SCAN_KEY] = scan
    if "model_processing" in config:  # checked by CLTConfig; absent: raw weights
        fields["metadata"]["model_processing"] = config["model_processing"]
    try:
        cfg = CLTConfig(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: {e}") from e
    state: dict[str, Tensor] = {}
    shapes = {"W_enc": (cfg.d_sae, cfg.d_in), "b_enc": (cfg.d_sae,), "b_dec": (cfg.d_out,)}
    shapes.update({"threshold": (cfg.d_sae,)} if cfg.architecture == "jumprelu" else {})
    shapes.update({"W_skip": (cfg.d_out, cfg.d_in)} if cfg.skip else {})
    for i in range(n):
        want = {f"{k}_{i}": s for k, s in shapes.items()}
        check_tensors(enc[i], want, folder / f"W_enc_{i}.safetensors")
        check_tensors(dec[i], {f"W_dec_{i}": (cfg.d_sae, n - i, cfg.d_out)}, folder / f"W_dec_{i}.safetensors")
    state["W_enc"] = torch.stack([enc[i][f"W_enc_{i}"].T for i in range(n)])
    for k in shapes:
        if k != "W_enc":
            state[k] = torch.stack([enc[i][f"{k}_{i}"] for i in range(n)])
    state.update({f"W_dec.{i}": dec[i][f"W_dec_{i}"] for i in range(n)})
    state = {k: v.to(cfg.torch_dtype) for k, v in state.items()}
    files = {f"W_dec.{i}": f for i in range(n) for f in getattr(dec[i], "files", {}).values()}
    cast, cast_name = cast_state(state, dtype)
    if cast_name is not None:
        cfg.dtype = cast_name
    clt = load_built(CrossLayerTranscoder, cfg, cast, device)
    record_file_weights(clt, MappedState(state, files))  # the decoders still their files' (uncast)
    return clt  # type: ignore[no-any-return]
