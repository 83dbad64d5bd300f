"""`Transcoder`: a per-layer transcoder (PLT) that reads the MLP's input and predicts its output.

    encode:  h = x @ W_enc + b_enc                                   # [..., d_sae], no b_dec subtracted
             f = act(h)     relu:      ReLU(h)
                            jumprelu:  h * (h > threshold)            (ReLU'd too if nonnegative_acts)
                            topk:      the k largest h per token, the rest 0   (ReLU'd too if nonnegative_acts)
    decode:  y = f @ W_dec + b_dec  (+ x @ W_skip.T with a skip)      # [..., d_out]

with sae-lens' parameter names and shapes (W_enc [d_in, d_sae], W_dec [d_sae, d_out], W_skip
[d_out, d_in]). Each step passes through a hook point with the SAE's names: `hook_sae_input`
(x, [..., d_in]), `hook_sae_acts_pre` (h), `hook_sae_acts_post` (f), `hook_sae_recons` (y, the whole
prediction, skip included), `hook_sae_output` (what `forward` returns; a splice puts y + error
there), `hook_sae_error` (set by a splice with the error term). sae-lens' SkipTranscoder adds its
skip after `hook_sae_recons`; here the skip reads the input as `hook_sae_input` passed it on.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..common import (
    NO_HOOKS,
    CoderHookPoints,
    add_hook_points,
    cast_state,
    check_init_seed,
    dtype_name,
    hooks_of,
    load_built,
    parse_dtype,
    zero_if_present,
)
from ..mapped import record_file_weights
from ..names import check_model_name, set_model_name
from .config import PROCESSING_KEY, SAELENS_ARCHITECTURES, TranscoderConfig, transcoder_shapes
from .io import FORMATS, read_transcoder_files, write_saelens_folder, write_transcoder_set
from .processing import Plan, apply_input, apply_output, conversion_plan, convert_state

__all__ = ["Transcoder", "load_transcoders", "save_transcoders", "check_transcoder_fits", "lazy_on"]


def activate(pre: Tensor, cfg: Any, threshold: Tensor | None = None) -> Tensor:
    """A transcoder's activation of its pre-activations `pre` (cfg: architecture, k, nonnegative_acts)."""
    arch = cfg.architecture
    if arch == "relu":
        return torch.relu(pre)
    if arch == "jumprelu":
        assert threshold is not None
        kept = pre.relu() if cfg.nonnegative_acts else pre
        return kept * (pre > threshold).to(pre.dtype)
    # topk: the k largest pre-activations as they are (or ReLU'd), the rest 0
    values, indices = torch.topk(pre, k=cfg.k, dim=-1, sorted=False)
    values = values.relu() if cfg.nonnegative_acts else values
    return torch.zeros_like(pre).scatter_(-1, indices, values)


class Transcoder(CoderHookPoints, nn.Module):
    """A per-layer transcoder: sae-lens' Transcoder / SkipTranscoder / JumpReLU(Skip)Transcoder, and
    circuit-tracer's SingleLayerTranscoder (ReLU, JumpReLU, TopK, skip), in one class.

    Example (tiny-gpt2's MLP reads and writes 128 wide):
        >>> tc = Transcoder(TranscoderConfig(d_in=128, d_sae=512, d_out=128, skip=True,
        ...     metadata={"hook_name": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out"}))
        >>> x = torch.randn(2, 5, 128)                 # what blocks.1.ln2.hook_normalized holds
        >>> feats = tc.encode(x)                        # [2, 5, 512]
        >>> tc.decode(feats, x).shape                   # the skip reads x too
        torch.Size([2, 5, 128])
        >>> tc(x).shape                                 # decode(encode(x), x)
        torch.Size([2, 5, 128])
    """

    def __init__(self, cfg: TranscoderConfig | dict[str, Any]):
        super().__init__()
        if isinstance(cfg, dict):  # a sae-lens cfg.json's contents, or the fields by name
            saelens = cfg.get("architecture") in SAELENS_ARCHITECTURES
            cfg = TranscoderConfig.from_dict(cfg) if saelens else TranscoderConfig(**cfg)
        if not isinstance(cfg, TranscoderConfig):
            raise TypeError(f"cfg: expected a TranscoderConfig (or its fields as a dict), got {type(cfg).__name__}")
        self.cfg = cfg
        dtype, device = cfg.torch_dtype, torch.device(cfg.device)
        for name, shape in transcoder_shapes(cfg).items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape, dtype=dtype, device=device)))
        if device.type != "meta":
            self.init_weights()
        # hook_sae_input [..., d_in]; _acts_pre, _acts_post [..., d_sae]; _output, _recons [..., d_out];
        # hook_sae_error [..., d_out], only spliced with use_error_term=True
        add_hook_points(self)

    W_enc: nn.Parameter  # [d_in, d_sae]
    W_dec: nn.Parameter  # [d_sae, d_out]
    b_enc: nn.Parameter  # [d_sae]
    b_dec: nn.Parameter  # [d_out]
    W_skip: nn.Parameter  # [d_out, d_in], skip only
    threshold: nn.Parameter  # [d_sae], jumprelu only

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """sae-lens' transcoder initialisation: W_enc and W_dec Kaiming-uniform (bounds sqrt(6 / d_sae)
        and sqrt(6 / d_out), the fan-in torch reads from their second axis), biases, W_skip and
        thresholds 0. `seed` makes it reproducible (a generator of its own; the global one is untouched)."""
        check_init_seed(seed)
        device = self.W_dec.device
        gen = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
        for name in ("W_dec", "W_enc"):
            p = getattr(self, name)
            bound = math.sqrt(6.0 / p.shape[1])
            w = torch.rand(p.shape, generator=gen, device=device, dtype=torch.float32)
            p.copy_((w * 2 - 1) * bound)
        zero_if_present(self, ("b_enc", "b_dec", "W_skip", "threshold"))

    # ----- what the splice reads ----------------------------------------------------------
    @property
    def input_hook(self) -> str | None:
        """The model hook it reads (cfg.metadata.hook_name), e.g. "blocks.1.ln2.hook_normalized"."""
        return self.cfg.input_hook

    @property
    def output_hook(self) -> str | None:
        """The model hook it predicts (cfg.metadata.hook_name_out), e.g. "blocks.1.hook_mlp_out"."""
        return self.cfg.output_hook

    @property
    def layer(self) -> int | None:
        """The layer of the MLP it replaces (from its hooks), or None."""
        return self.cfg.layer

    @property
    def d_in(self) -> int:
        """The width of its input."""
        return self.cfg.d_in

    @property
    def d_sae(self) -> int:
        """The number of features."""
        return self.cfg.d_sae

    @property
    def d_out(self) -> int:
        """The width of its output."""
        return self.cfg.d_out

    # (dtype, device, hook_names: CoderHookPoints')

    # ----- the two halves ---------------------------------------------------------------------
    def _check_input(self, x: Any, arg: str, caller: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{caller}: {arg}: expected a tensor [..., d_in={self.cfg.d_in}], got {type(x).__name__}")
        if x.ndim == 0 or x.shape[-1] != self.cfg.d_in:
            raise ValueError(
                f"{caller}: {arg} has shape {tuple(x.shape)}; expected [..., d_in={self.cfg.d_in}] "
                f"(what {self.cfg.input_hook or 'its input hook'} holds)"
            )
        if not x.is_floating_point():
            raise TypeError(f"{caller}: {arg}: expected a float tensor, got dtype {x.dtype}")
        return x

    def _encode(self, x: Tensor, hooked: bool = True) -> tuple[Tensor, Tensor]:
        """(feature activations, the input as the encoder read it: what the skip reads). `hooked=False`
        runs past the hook points (the clean pass of a splice's error term)."""
        hp = hooks_of(self) if hooked else NO_HOOKS
        x = hp["hook_sae_input"](x.to(self.dtype))
        pre = hp["hook_sae_acts_pre"](x @ self.W_enc + self.b_enc)
        threshold = self.threshold if self.cfg.architecture == "jumprelu" else None
        return hp["hook_sae_acts_post"](activate(pre, self.cfg, threshold)), x

    def _decode(self, acts: Tensor, x: Tensor | None, hooked: bool = True) -> Tensor:
        out = acts.to(self.dtype) @ self.W_dec + self.b_dec
        if self.cfg.skip:
            assert x is not None
            out = out + x.to(self.dtype) @ self.W_skip.T
        return self.hook_sae_recons(out) if hooked else out

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations of `x` (cast to the transcoder's dtype). Example: `tc.encode(mlp_in)[..., 42]`."""
        acts, _ = self._encode(self._check_input(x, "x", "Transcoder.encode"))
        return acts

    def decode(
        self, feature_acts: Float[Tensor, "... d_sae"], x: Float[Tensor, "... d_in"] | None = None
    ) -> Float[Tensor, "... d_out"]:
        """The predicted output of feature activations; a skip transcoder also needs its input `x`
        (ignored without a skip). Example: `tc.decode(tc.encode(x), x)`."""
        if not isinstance(feature_acts, Tensor):
            raise TypeError(f"Transcoder.decode: feature_acts: expected a tensor, got {type(feature_acts).__name__}")
        if feature_acts.ndim == 0 or feature_acts.shape[-1] != self.cfg.d_sae:
            raise ValueError(
                f"Transcoder.decode: feature_acts has shape {tuple(feature_acts.shape)}; "
                f"expected [..., d_sae={self.cfg.d_sae}]"
            )
        if self.cfg.skip:
            if x is None:
                raise ValueError(
                    "Transcoder.decode: x: a skip transcoder adds x @ W_skip.T; pass its input, decode(acts, x)"
                )
            self._check_input(x, "x", "Transcoder.decode")
            if x.shape[:-1] != feature_acts.shape[:-1]:
                raise ValueError(
                    f"Transcoder.decode: x has shape {tuple(x.shape)} but feature_acts {tuple(feature_acts.shape)}: "
                    "expected the same leading axes"
                )
        return self._decode(feature_acts, x)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """decode(encode(x), x) through `hook_sae_output`: the predicted MLP output (the error term is
        the splice's job). Example: `mlp_out_hat = tc(mlp_in)`."""
        acts, x_in = self._encode(self._check_input(x, "x", "Transcoder.forward"))
        return self.hook_sae_output(self._decode(acts, x_in))

    # ----- splicing (interp_gpt.model.splicing's protocol: `with model.transcoders([...])`) -----------
    def splice_hooks(self, model: Any, arg: str = "transcoder") -> tuple[str, str]:
        """(read, write): the hook it reads (`blocks.L.ln2.hook_normalized` or `blocks.L.hook_resid_mid`)
        and the one it replaces (`blocks.L.hook_mlp_out`), once it fits `model` (`check_transcoder_fits`).
        Made for other weights than the model's (raw / processed, cfg.metadata.model_processing), it is
        spliced exactly converted (its input and output mapped as `converted_to` maps its weights), or
        refused by name where no exact conversion exists."""
        plan = fit_plan(model, self, caller="splice", arg=arg)
        if self.input_hook is None or self.output_hook is None:
            raise ValueError(
                f"{arg}: cfg.metadata.hook_name (the input) and hook_name_out (the output) must both be set to splice "
                f"it, got {self.input_hook!r} and {self.output_hook!r}"
            )
        return take_splice_plan(self, model, plan)

    def splice_forward(self, x: Tensor, hooked: bool = True) -> Tensor:
        """The prediction from the read hook's `x`, not through `hook_sae_output` (the splice runs that,
        after the error term); `hooked=False` past every hook point: the error term's clean pass. Where
        the model's weights are processed otherwise than its own, `x` is first mapped to what it reads
        (`hook_sae_input` shows that) and its prediction (`hook_sae_recons`) to what the model writes."""
        plan = getattr(self, "_splice_plan", None)
        acts, x_in = self._encode(apply_input(x, plan), hooked=hooked)
        return apply_output(self._decode(acts, x_in, hooked=hooked), plan)

    def converted_to(self, model: Any, copy: bool = True) -> Transcoder:
        """A new transcoder computing, on `model`'s weights, exactly what this one computes on the weights it
        was made for (cfg.metadata.model_processing: raw or processed, see transcoder_processing), with
        `model`'s processing recorded; a ValueError naming the hook and why where no exact conversion exists.
        `copy=False`: this transcoder itself where nothing needs converting (the checks still run).

        Example:
            >>> from interp_gpt.sae.data import SHIPPED_TRANSCODERS_DIR
            >>> tc = load_transcoders(SHIPPED_TRANSCODERS_DIR)[1]
            >>> tc.cfg.processing                           # the shipped ones: for the processed model
            {'fold_ln': True, 'center_writing_weights': True}
            >>> unfolded = tc.converted_to(GPT.from_pretrained("tiny-gpt2", fold_ln=False))   # LayerNorm unfolded
            >>> unfolded.cfg.processing
            {'fold_ln': False, 'center_writing_weights': True}
        """
        return converted_with(
            self, model, fit_plan(model, self, caller="Transcoder.converted_to", arg="transcoder"), copy
        )

    # (reset_hooks: CoderHookPoints')

    # ----- loading and saving ------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        *,
        lazy: bool | None = None,
    ) -> Transcoder:
        """Load one transcoder: a sae-lens folder (cfg.json + sae_weights.safetensors), or any path
        `load_transcoders` reads that holds exactly one (a circuit-tracer config of one layer ...).

        Example:
            >>> paths = tcs[1].save_model("transcoders/layer_1")
            >>> tc = Transcoder.from_pretrained("transcoders/layer_1")
        """
        tcs = load_transcoders(path, device=device, dtype=dtype, lazy=lazy)
        if len(tcs) != 1:
            layers = [t.layer for t in tcs]
            raise ValueError(
                f"path={str(path)!r} holds {len(tcs)} transcoders (layers {layers}); "
                "load them with load_transcoders(path), or pass one layer's folder"
            )
        return tcs[0]

    load_from_disk = from_pretrained  # sae-lens' name for a local folder

    def save_model(self, path: str | Path) -> tuple[Path, Path]:
        """Write `cfg.json` and `sae_weights.safetensors` into the folder `path` (sae-lens' format: sae-lens'
        `SAE.load_from_disk` loads it, TopK aside). Returns (weights path, cfg path), as sae-lens does.

        Example:
            >>> tc = tcs[1]
            >>> cfg_path, weights_path = tc.save_model("transcoders/layer_1")
        """
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path: expected a folder path, got {type(path).__name__}")
        return write_saelens_folder(Path(path), *_item(self))

    def to_dtype(self, dtype: str | torch.dtype) -> Transcoder:
        """Cast every tensor to `dtype` and record it in cfg.dtype (in place; returns self)."""
        torch_dtype = parse_dtype(dtype)
        self.to(torch_dtype)
        self.cfg.dtype = dtype_name(torch_dtype)
        return self

    def extra_repr(self) -> str:
        """Its shape and hooks, in `repr`."""
        c = self.cfg
        extra = f", k={c.k}" if c.architecture == "topk" else ""
        extra += ", skip" if c.skip else ""
        return (
            f"{c.architecture}, d_in={c.d_in}, d_sae={c.d_sae}, d_out={c.d_out}{extra}, "
            f"input_hook={c.input_hook!r}, output_hook={c.output_hook!r}"
        )


# ----------------------------------------------------------------------------------------------
# Sets of transcoders: one per layer
# ----------------------------------------------------------------------------------------------
def _item(tc: Transcoder) -> tuple[TranscoderConfig, dict[str, Tensor]]:
    """Its config (dtype and device brought up to date) and its tensors, as the file writers take them."""
    tc.cfg.dtype = dtype_name(tc.dtype)
    tc.cfg.device = str(tc.device)
    shapes = transcoder_shapes(tc.cfg)
    return tc.cfg, {k: v for k, v in tc.state_dict().items() if k in shapes}


def _build(cfg: TranscoderConfig, state: dict[str, Tensor], device: str | torch.device) -> Transcoder:
    return load_built(Transcoder, cfg, state, device)  # type: ignore[no-any-return]


def load_transcoders(
    path: str | Path | list[str | Path],
    model: Any = None,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    model_name: str | None = None,
    lazy: bool | None = None,
) -> list[Transcoder]:
    """Load per-layer transcoders, sorted by layer, from any of:

    - a sae-lens transcoder folder (cfg.json + sae_weights.safetensors), or a folder of them (one per
      layer, as `save_transcoders(..., format="saelens")` writes);
    - a circuit-tracer set: its `config.yaml` or the folder holding it (see transcoder_io);
    - a list of any of these.

    Everything is checked before a transcoder is built: names, shapes and finiteness of every tensor
    (CheckpointError naming the file), a layer given twice. With `model`, each transcoder must fit it:
    its metadata.model_name (when recorded) names the model's, its layer exists, its widths match its
    hooks'; one made for other weights (metadata.model_processing, raw unless the file says: circuit-tracer's
    are) comes back exactly converted to the model's (`Transcoder.converted_to`), or is refused by name.
    `model_name` (e.g. "my-gpt2", a local copy of GPT-2) records the model they are for in each one's
    metadata.model_name, in place of the files' (None: the files' own).

    `lazy`: whether W_enc and W_dec stay memory-mapped from their files, read only where used (a private
    map: writing to them never changes the file), so that a set costs little memory until it computes;
    `attribute` reads one layer's encoder at a time and only the decoder rows of the active features
    (interp_gpt.sae.mapped). None (the default): on the CPU, what maps exactly (the tensors the transcoder
    holds in the file's own layout: every W_dec, and sae-lens' W_enc; circuit-tracer files hold W_enc
    transposed: read); True: circuit-tracer's W_enc too, held as a transposed view (nothing of the set
    resident; computing on it agrees with an eager load within float rounding, `attribute` reads it
    exactly); False: everything read now. Values are checked either way (lazily through a map given back
    afterwards). A cast (`dtype`) or a conversion to the model's weights reads them into memory.

    Example:
        >>> folder = save_transcoders(tcs, "transcoders/tiny-gpt2")
        >>> tcs = load_transcoders("transcoders/tiny-gpt2")           # one Transcoder per layer
        >>> [tc.input_hook for tc in tcs]
        ['blocks.0.ln2.hook_normalized', 'blocks.1.ln2.hook_normalized']
    """
    items = read_transcoder_files(path, device, lazy_on(lazy, device, dtype, "load_transcoders"))
    seen: dict[int, str] = {}
    for cfg, _ in items:
        layer = cfg.layer
        if layer is not None:
            if layer in seen:
                raise ValueError(
                    f"load_transcoders: layer {layer} is given twice ({seen[layer]!r} and {cfg.input_hook!r}); "
                    "pass one transcoder per layer"
                )
            seen[layer] = cfg.input_hook or ""
    tcs = []
    for cfg, state in items:
        set_model_name(cfg.metadata, model_name, "load_transcoders")
        cast, name = cast_state(state, dtype)
        if name is not None:
            cfg.dtype = name
        tcs.append(_build(cfg, cast, device))
        record_file_weights(tcs[-1], state)  # the parameters still their files' (uncast, on the CPU)
    tcs.sort(key=lambda t: (t.layer is None, t.layer or 0))
    if model is not None:  # each checked first, then each converted to the model's weights (or refused)
        plans = [fit_plan(model, tc, caller="load_transcoders") for tc in tcs]
        tcs = [tc if p is None or (p.identity and p.processing == tc.cfg.processing) else tc.converted_to(model)
               for tc, p in zip(tcs, plans, strict=True)]  # fmt: skip
    return tcs


def lazy_on(lazy: Any, device: str | torch.device, dtype: Any, caller: str) -> bool | None:
    """How to load: `lazy` as given (None: what maps exactly), False off the CPU. A map is read on the CPU
    only: lazy=True with another device is refused by name (a cast still works: it reads them)."""
    if lazy is not None and not isinstance(lazy, bool):
        raise TypeError(f"{caller}: lazy={lazy!r}: expected True, False or None (lazily on the CPU)")
    on_cpu = torch.device(device).type == "cpu"
    if lazy and not on_cpu:
        raise ValueError(
            f"{caller}: lazy=True with device={str(device)!r}: weights are mapped from their files on the CPU only; "
            "pass lazy=False (or None) to load them onto the device"
        )
    return lazy if on_cpu else False


def save_transcoders(tcs: Transcoder | list[Transcoder], path: str | Path, format: str = "saelens") -> Path:
    """Save per-layer transcoders as one folder, written whole or not at all (into a temporary folder
    beside `path` that takes its name when every file is complete; an older set there is replaced).

    format="saelens": `path/layer_{l}/` per layer, each sae-lens' cfg.json + sae_weights.safetensors.
    format="circuit-tracer": `path/config.yaml` + `path/layer_{l}.safetensors`; it holds layers 0..n-1
    sharing one input hook, output hook, activation, k, skip and width, as circuit-tracer needs.
    A transcoder whose numbers the format would change (see TranscoderConfig.nonnegative_acts) is refused.

    Example:
        >>> save_transcoders(tcs, "transcoders/tiny-gpt2", format="circuit-tracer")
        >>> load_transcoders("transcoders/tiny-gpt2")     # the same transcoders, bit for bit
    """
    if isinstance(tcs, Transcoder):
        tcs = [tcs]
    if not isinstance(tcs, (list, tuple)) or not tcs:
        raise TypeError(f"save_transcoders: tcs: expected a Transcoder or a non-empty list of them, got {tcs!r:.60}")
    for i, tc in enumerate(tcs):
        if not isinstance(tc, Transcoder):
            raise TypeError(f"save_transcoders: tcs[{i}]: expected a Transcoder, got {type(tc).__name__}")
        if tc.layer is None:
            raise ValueError(
                f"save_transcoders: tcs[{i}].cfg.metadata.hook_name={tc.input_hook!r} names no layer "
                "(blocks.L....): a set is saved one file per layer"
            )
    layers = [tc.layer for tc in tcs]
    twice = sorted({x for x in layers if layers.count(x) > 1})  # type: ignore[type-var]
    if twice:
        raise ValueError(f"save_transcoders: layers {twice} are given twice; pass one transcoder per layer")
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"save_transcoders: format={format!r}; expected one of {', '.join(map(repr, FORMATS))}")
    if not isinstance(path, (str, Path)):
        raise TypeError(f"save_transcoders: path: expected a folder path, got {type(path).__name__}")
    items = [_item(tc) for tc in sorted(tcs, key=lambda t: t.layer or 0)]
    return write_transcoder_set(items, Path(path).expanduser(), format)


_D_MODEL_HOOKS = (
    "hook_resid_pre",
    "hook_resid_mid",
    "hook_resid_post",
    "ln2.hook_normalized",
    "hook_mlp_out",
    "hook_mlp_in",
    "mlp.hook_in",
    "ln1.hook_normalized",
    "hook_attn_out",
)


def converted_with(tc: Transcoder, model: Any, plan: Plan | None, copy: bool = True) -> Transcoder:
    """`tc.converted_to(model, copy)` given its `fit_plan(model, tc)` already worked out (checking a model's
    weights costs a pass over them: a caller that checked the fit first need not ask again)."""
    if not copy and (plan is None or (plan.identity and plan.read_hook == tc.input_hook)):
        return tc
    cfg = TranscoderConfig(**{f: getattr(tc.cfg, f) for f in tc.cfg.__dataclass_fields__})
    cfg.metadata = type(tc.cfg.metadata)(tc.cfg.metadata)
    state = {k: v for k, v in tc.state_dict().items() if k in transcoder_shapes(cfg)}
    if plan is not None:
        cfg.metadata.update({PROCESSING_KEY: dict(plan.processing), "hook_name": plan.read_hook})
        state = convert_state(state, plan)
    else:
        state = {k: v.clone() for k, v in state.items()}
    return _build(cfg, state, tc.device)


def check_transcoder_fits(
    model: Any, tc: Transcoder, caller: str = "check_transcoder_fits", arg: str = "transcoder"
) -> None:
    """Refuse, by name, a transcoder that cannot run on `model`: another model's (metadata.model_name),
    a layer it lacks, a hook it lacks (KeyError), widths other than its hooks', or one made for other
    weights (raw / processed: metadata.model_processing) that has no exact conversion to the model's."""
    fit_plan(model, tc, caller, arg)


def take_splice_plan(module: Any, model: Any, plan: Plan | None) -> tuple[str, str]:
    """(read, write) hooks of a transcoder (or a CLT's layer view) being spliced into `model`, once it
    fits, keeping `plan` (its map onto the model's weights) for its splice_forward."""
    owner = getattr(module, "_spliced_in", None)
    if owner is None or owner is getattr(model, "hook_dict", {}).get(module.output_hook):
        # (spliced in elsewhere, the splice refuses it next: that splice's map stays)
        module._splice_plan = None if plan is None or plan.identity else plan
    read = plan.read_hook if plan is not None and plan.read_hook else module.input_hook
    return read, module.output_hook


def fit_plan(model: Any, tc: Transcoder, caller: str = "check_transcoder_fits", arg: str = "transcoder") -> Plan | None:
    """check_transcoder_fits' checks, then the map onto the model's weights (None: no layer to map)."""
    cfg = model.cfg
    where = f"{caller}: the {arg} of layer {tc.layer}"
    check_model_name(
        tc.cfg.model_name, model, where, "load_clt" if getattr(tc, "clt", None) is not None else "load_transcoders"
    )
    if tc.layer is not None and not 0 <= tc.layer < cfg.n_layers:
        raise ValueError(f"{where}: layer {tc.layer} does not exist: the model's layers are 0..{cfg.n_layers - 1}")
    hook_dict = getattr(model, "hook_dict", {})
    for field, hook, width in (("d_in", tc.input_hook, tc.d_in), ("d_out", tc.output_hook, tc.d_out)):
        if hook is None:
            continue
        if hook.endswith(".mlp.hook_in") and tc.layer is not None:  # the MLP's input: read at ln2.hook_normalized
            hook = f"blocks.{tc.layer}.ln2.hook_normalized"
        if hook_dict and hook not in hook_dict:
            unknown = getattr(model, "_unknown_hook_error", None)
            why = unknown(hook).args[0] if callable(unknown) else f"no hook point named {hook!r}"
            raise KeyError(f"{where}: cfg.metadata.{'hook_name' if field == 'd_in' else 'hook_name_out'}: {why}")
        if hook.split(".", 2)[-1] in _D_MODEL_HOOKS and width != cfg.d_model:
            raise ValueError(f"{where}: {field}={width} does not fit {hook!r}, which is d_model={cfg.d_model} wide")
    if tc.layer is None or not hasattr(model, "blocks"):
        return None
    w_skip = tc.W_skip if tc.cfg.skip else None
    return conversion_plan(tc.cfg.processing, tc.input_hook, tc.output_hook, tc.layer, tc.W_enc, w_skip, model, where)
