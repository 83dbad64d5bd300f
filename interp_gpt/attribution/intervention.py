"""Feature interventions: set transcoder features to chosen values and see what the model does --
circuit-tracer's `feature_intervention` and `feature_intervention_generate`, on our hook points.

The transcoders are spliced in with the error term, so the model computes exactly what it computes without
them, and a hook at each intervened layer's `blocks.L.hook_mlp_out.hook_sae_acts_post` moves the chosen
features: `(new - current) x W_dec` more goes into that layer's MLP output (a CLT's: that and later layers').
circuit-tracer's definitions, kept: an intervention is `(layer, pos, feature, value)` (`pos` an int, slice
or tensor; `feature` an int or tensor; later ones at the same place win); the current activation is the
transcoder's reading in the intervened run, position 0 (the BOS) read as 0 (a model without a tokenizer has
no BOS put first: its position 0 is kept); `freeze_attention=True` holds every attention pattern at the
clean run's (not LayerNorm scales or MLPs); the activations returned are the readings of the intervened run
`[n_layers, pos, d_sae]` (what each layer read, not the values set); generation: the first step carries
every intervention, each new token the open-ended ones (`pos` a slice with no stop; one starting after the
prompt, e.g. `slice(n_prompt, None)`, steers the new tokens only; its value must fit one token's places),
unfrozen, one logits row per token; `constrained_layers` (first pass only): those layers' MLP outputs are
the clean run's plus the change of the skip term, only they take decoder rows, patterns held (all layers:
LayerNorm scales too: direct effects). The prompt is read as `attribute` reads it.

Example (tiny-gpt2 and its shipped transcoders):
    >>> from interp_gpt import GPT
    >>> from interp_gpt.attribution import feature_intervention, feature_intervention_generate
    >>> from interp_gpt.sae.training import shipped_transcoders
    >>> model = GPT.from_pretrained("tiny-gpt2")
    >>> tcs = shipped_transcoders(model)
    >>> logits, acts = feature_intervention(model, "The cat sat on the", tcs, [(1, -1, 3, 5.0)])
    >>> text, step_logits, acts = feature_intervention_generate(
    ...     model, "The cat sat on the", tcs, [(1, slice(1, None), 3, 5.0)], max_new_tokens=3)
    >>> step_logits.shape[0]
    3
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..checks import check_int_in_range
from ._inputs import bos_positions, in_model_dtype, prepare

__all__ = ["feature_intervention", "feature_intervention_generate"]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _show(value: Tensor) -> str:
    """A value tensor for a message: its numbers if few, else its shape."""
    if value.numel() <= 6:
        return repr(value.tolist())
    return f"a tensor of shape {tuple(value.shape)}"


def _check_index(x: Any, size: int, what: str, arg: str, caller: str, slices: bool, new_ok: bool = False) -> None:
    """An int, an integer tensor (or, with `slices`, a slice) indexing `size` entries."""
    if slices and isinstance(x, slice):
        for end in ("start", "stop", "step"):
            v = getattr(x, end)
            if v is not None and not _is_int(v):
                raise TypeError(f"{caller}: {arg}: {x!r} has a {type(v).__name__} {end}; expected ints")
        if x.step is not None and x.step <= 0:
            raise ValueError(f"{caller}: {arg}: {x!r} has step {x.step}; expected a positive step")
        if not range(size)[x] and not (new_ok and _new_only(x, size)):
            raise ValueError(f"{caller}: {arg}: {x!r} selects none of the {size} {what}")
        return
    if isinstance(x, Tensor):
        if x.is_floating_point() or x.dtype == torch.bool or x.ndim > 1:
            raise TypeError(f"{caller}: {arg}: a {x.dtype} tensor of shape {tuple(x.shape)}; expected integer {what}")
        values = x.flatten().tolist()
    elif _is_int(x):
        values = [x]
    else:
        kinds = "an int, a slice or an integer tensor" if slices else "an int or an integer tensor"
        raise TypeError(f"{caller}: {arg}={x!r}: expected {kinds}")
    bad = [v for v in values if not -size <= v < size]
    if bad:
        raise ValueError(f"{caller}: {arg}={bad[0]} is out of range: there are {size} {what} (0..{size - 1})")


def _new_only(x: slice, n_pos: int) -> bool:
    """Whether `x` is open-ended from a position after the prompt: in generation, the new tokens' alone."""
    return x.stop is None and x.start is not None and x.start >= n_pos


def _check_interventions(
    interventions: Any, n_layers: int, n_pos: int, d_sae: int, caller: str, generating: bool = False
) -> dict[int, list[tuple[Any, Any, Any]]]:
    """The interventions by layer, each checked by name; `generating`: an open-ended slice may start after
    the prompt (it then steers the new tokens only), and its value must fit one new token's places."""
    if not isinstance(interventions, Sequence) or isinstance(interventions, (str, bytes)):
        raise TypeError(
            f"{caller}: interventions: expected a list of (layer, pos, feature, value), got {type(interventions).__name__}"
        )
    by_layer: dict[int, list[tuple[Any, Any, Any]]] = {}
    for i, item in enumerate(interventions):
        arg = f"interventions[{i}]"
        if not isinstance(item, (tuple, list)) or len(item) != 4:
            raise TypeError(f"{caller}: {arg}={item!r}: expected a (layer, pos, feature, value) tuple")
        layer, pos, feature, value = item
        if isinstance(layer, Tensor) and layer.numel() == 1 and not layer.is_floating_point():
            layer = int(layer)
        if not _is_int(layer):
            raise TypeError(f"{caller}: {arg}: layer={layer!r}: expected an int")
        if not 0 <= layer < n_layers:
            raise ValueError(f"{caller}: {arg}: layer={layer} is out of range: the model has layers 0..{n_layers - 1}")
        _check_index(pos, n_pos, "positions", f"{arg}: pos", caller, slices=True, new_ok=generating)
        _check_index(feature, d_sae, "features", f"{arg}: feature", caller, slices=False)
        if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
            raise TypeError(f"{caller}: {arg}: value={value!r}: expected a number or a tensor")
        if isinstance(value, Tensor):
            if value.is_complex() or value.dtype == torch.bool:
                raise TypeError(f"{caller}: {arg}: value is a {value.dtype} tensor; expected real numbers")
            value = value.detach()
            if not bool(torch.isfinite(value).all()):
                raise ValueError(
                    f"{caller}: {arg}: value={_show(value)} holds a non-finite number (nan or inf); expected finite "
                    "numbers (a nan or inf set at one position reaches every logit through the LayerNorms)"
                )
        elif not math.isfinite(value):
            raise ValueError(f"{caller}: {arg}: value={value}: expected a finite number")
        shape = _places(pos, feature, n_pos, f"{arg}: pos", f"{arg}: feature", caller)
        _check_value_fits(value, shape, f"{arg}: value", "the places pos and feature select", caller)
        if generating and isinstance(pos, slice) and pos.stop is None:
            what = "each new token's places (pos is open-ended: every new token takes it, at its one position)"
            _check_value_fits(value, _shape(feature), f"{arg}: value", what, caller)
        by_layer.setdefault(layer, []).append((pos, feature, value))
    return by_layer


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, Tensor) else ()


def _places(pos: Any, feature: Any, n_pos: int, pos_arg: str, feature_arg: str, caller: str) -> tuple[int, ...]:
    """The shape of the places `delta[pos, feature]` selects (torch's indexing: a slice of positions times the
    features; integer tensors broadcast together), or a ValueError naming both and their lengths."""
    if isinstance(pos, slice):
        return (len(range(n_pos)[pos]),) + _shape(feature)
    try:
        return tuple(torch.broadcast_shapes(_shape(pos), _shape(feature)))
    except RuntimeError:
        raise ValueError(
            f"{caller}: {pos_arg} has {pos.numel()} positions and {feature_arg} {feature.numel()} features: "
            "two tensors are paired place by place (position i with feature i), so they need the same length "
            "(or one of length 1); for every feature at every position pass pos as a slice, or pos[:, None]"
        ) from None


def _check_value_fits(value: Any, shape: tuple[int, ...], arg: str, what: str, caller: str) -> None:
    """A tensor value must broadcast to the `shape` of the places it is set at (a number always does)."""
    if not isinstance(value, Tensor):
        return
    try:
        fits = tuple(torch.broadcast_shapes(value.shape, shape)) == shape
    except RuntimeError:
        fits = False
    if not fits:
        shown = f"{arg} has shape" if value.numel() > 6 else f"{arg}={_show(value)} has shape"
        raise ValueError(
            f"{caller}: {shown} {tuple(value.shape)}; {what} have shape {shape}: expected one number, or a "
            "tensor of that shape (or one that broadcasts to it)"
        )


def _check_constrained(layers: Any, n_layers: int, caller: str) -> set[int] | None:
    """constrained_layers as a set of layers (None, or empty as circuit-tracer treats it: no constraint)."""
    if layers is None:
        return None
    if not isinstance(layers, (range, list, tuple)) or not all(_is_int(x) for x in layers):
        raise TypeError(f"{caller}: constrained_layers={layers!r}: expected a range (or list) of layer ints, or None")
    bad = [x for x in layers if not 0 <= x < n_layers]
    if bad:
        raise ValueError(
            f"{caller}: constrained_layers: layer {bad[0]} is out of range: the model has layers 0..{n_layers - 1}"
        )
    return set(layers) or None


def _delta(reading: Tensor, items: list[tuple[Any, Any, Any]]) -> Tensor:
    """`[pos, d_sae]` value - reading at the intervened places (later interventions win), 0 elsewhere."""
    delta = torch.zeros_like(reading)
    for pos, feature, value in items:
        if isinstance(value, Tensor):
            value = value.to(reading.device, reading.dtype)
        delta[pos, feature] = value - reading[pos, feature]
    return delta


class _Run:
    """The hooks of one intervened run (or generation): the features moved at each intervened layer, the
    readings recorded, the attention patterns frozen on the first pass."""

    def __init__(self, model: Any, readers: Any, by_layer: dict, open_ended: dict, record: bool, post: bool):
        self.model, self.readers, self.by_layer, self.open_ended = model, readers, by_layer, open_ended
        self.record, self.post = record, post
        self.bos = bos_positions(model)  # position 0 (the BOS) reads as 0, as circuit-tracer zeroes it
        self.step = -1  # the pass: 0 the prompt, then one per generated token
        self.n_prompt = 0  # the prompt's length (generation: where the new tokens start)
        self.acts: list[list[Tensor]] = [[] for _ in range(model.cfg.n_layers)]
        self.logits: list[Tensor] = []
        self.frozen: dict[str, Tensor] = {}  # hook name -> the clean run's value (first pass)
        # constrained_layers (first pass): the clean run's MLP outputs, inputs and readings
        self.constrained: set[int] | None = None
        self.clean_out: dict[int, Tensor] = {}
        self.clean_in: dict[int, Tensor] = {}
        self.original: dict[int, Tensor] = {}
        self.current_in: dict[int, Tensor] = {}
        self.model_out: dict[int, Tensor] = {}

    def freeze(self, tokens: Tensor, constrained: set[int] | None) -> None:
        """Run the prompt cleanly and keep what the first pass holds: the attention patterns; with
        `constrained` layers also the MLP outputs there (and every LayerNorm scale if all layers are)."""
        n = self.model.cfg.n_layers
        ends = ["attn.hook_pattern"]
        if constrained is not None and constrained >= set(range(n)):
            ends.append("hook_scale")
        names = {self.readers.input_hook(layer) for layer in range(n)} | {
            f"blocks.{layer}.hook_mlp_out{end}" for layer in range(n) for end in ("", ".hook_sae_acts_post")
        }
        _, cache = self.model.run_with_cache(
            tokens[None], names_filter=lambda name: name in names or name.endswith(tuple(ends))
        )
        self.frozen = {name: cache[name] for name in cache.keys() if name.endswith(tuple(ends))}
        if constrained is None:
            return
        self.constrained = constrained
        for layer in range(n):
            self.clean_out[layer] = cache[f"blocks.{layer}.hook_mlp_out"]
            self.clean_in[layer] = cache[self.readers.input_hook(layer)]
            reading = cache[f"blocks.{layer}.hook_mlp_out.hook_sae_acts_post"][0].clone()
            reading[self.bos] = 0
            self.original[layer] = reading

    def hooks(self) -> list[tuple[str, Any]]:
        hooks: list[tuple[str, Any]] = [("hook_embed", self._new_pass)]
        for layer in range(self.model.cfg.n_layers):
            at = f"blocks.{layer}.hook_mlp_out"
            if self.record and not self.post:
                hooks.append((f"{at}.hook_sae_acts_pre", lambda x, hook, layer=layer: self._keep(layer, x)))
            if self.record or layer in self.by_layer or layer in self.open_ended:
                hooks.append((f"{at}.hook_sae_acts_post", lambda x, hook, layer=layer: self._move(layer, x)))
        hooks += [(name, self._freeze) for name in self.frozen]
        if self.constrained is not None:
            for layer in range(self.model.cfg.n_layers):
                at = f"blocks.{layer}.hook_mlp_out"
                hooks.append((self.readers.input_hook(layer), lambda x, hook, layer=layer: self._read_in(layer, x)))
                hooks.append((at, lambda x, hook, layer=layer: self._mlp_out(layer, x)))
                hooks.append((f"{at}.hook_sae_output", lambda x, hook, layer=layer: self._written(layer, x)))
        hooks.append(("unembed.hook_out", self._logits))
        return hooks

    def _first_constrained(self) -> bool:
        return self.step == 0 and self.constrained is not None

    def _read_in(self, layer: int, x: Tensor) -> None:
        self.current_in[layer] = x

    def _mlp_out(self, layer: int, x: Tensor) -> Tensor:
        """Constrained layers: the clean MLP output, plus the change of the skip term (the features'
        changes are added by the splice after this)."""
        self.model_out[layer] = x
        if not self._first_constrained() or layer not in self.constrained:  # type: ignore[operator]
            return x
        out = self.clean_out[layer]
        skip_now = self.readers.skip(layer, self.current_in[layer])
        if skip_now is not None:
            out = out + (skip_now - self.readers.skip(layer, self.clean_in[layer]))
        return out

    def _written(self, layer: int, x: Tensor) -> Tensor:
        """Layers outside the constrained range take no intervention's decoder rows."""
        if self._first_constrained() and layer not in self.constrained:  # type: ignore[operator]
            return self.model_out[layer]
        return x

    def _new_pass(self, x: Tensor, hook: Any) -> None:
        self.step += 1

    def _reading(self, x: Tensor) -> Tensor:
        reading = x[0].detach().clone()
        if self.step == 0:
            reading[self.bos] = 0
        return reading

    def _keep(self, layer: int, x: Tensor) -> None:
        self.acts[layer].append(self._reading(x))

    def _move(self, layer: int, x: Tensor) -> Tensor:
        reading = self._reading(x)
        if self.record and self.post:
            self.acts[layer].append(reading)
        items = self.by_layer.get(layer) if self.step == 0 else self._open_now(layer)
        if not items:
            return x
        base = self.original[layer] if self._first_constrained() else reading
        return x + _delta(base, items)[None]

    def _open_now(self, layer: int) -> list[tuple[Any, Any, Any]]:
        """The open-ended interventions that reach this pass's new token (its one position, 0): a slice from a
        position at or before it (every `step`-th), or from a negative start (counted in the prompt: every one)."""
        at = self.n_prompt + self.step - 1  # the new token's position in the whole sequence
        kept = []
        for pos, feature, value in self.open_ended.get(layer, []):
            start, step = pos.start or 0, pos.step or 1
            if start < 0 or (at >= start and (at - start) % step == 0):
                kept.append((0, feature, value))
        return kept

    def _freeze(self, x: Tensor, hook: Any) -> Tensor | None:
        return self.frozen[hook.name] if self.step == 0 else None

    def _logits(self, x: Tensor, hook: Any) -> None:
        self.logits.append(x.detach().clone())

    def activations(self, sparse: bool = False) -> Tensor:
        acts = torch.stack([torch.cat(per_layer, dim=0) for per_layer in self.acts])
        return acts.to_sparse().coalesce() if sparse else acts


def _setup(
    caller: str, model: Any, prompt: Any, transcoders: Any, interventions: Any, flags: dict[str, Any]
) -> tuple[Tensor, Any, Any, dict]:
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{caller}: {name}={flag!r}: expected True or False")
    model, tokens, readers = prepare(model, prompt, transcoders, caller)
    # spliced in, so in the model's dtype (copies): float32 transcoders on a float64 or bf16 model, as attribute
    readers = in_model_dtype(model, readers)
    spliced = readers.plts if readers.plts is not None else readers.clt
    d_sae = readers.encoder(0).shape[1]
    generating = caller == "feature_intervention_generate"
    by_layer = _check_interventions(interventions, model.cfg.n_layers, tokens.shape[0], d_sae, caller, generating)
    return tokens, readers, spliced, by_layer


@torch.no_grad()
def feature_intervention(
    model: Any,
    prompt: str | Tensor | list[int],
    transcoders: Any,
    interventions: Sequence[tuple[Any, Any, Any, Any]],
    *,
    constrained_layers: range | Sequence[int] | None = None,
    freeze_attention: bool = True,
    apply_activation_function: bool = True,
    sparse: bool = False,
    return_activations: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """The logits `[1, pos, d_vocab]` of `prompt` with `interventions` applied, and the transcoders'
    readings of that run `[n_layers, pos, d_sae]` (None with `return_activations=False`); see the
    module's docs for the definitions (circuit-tracer's).

    Args:
        model: a `GPT`.
        prompt: text or token ids; a BOS is put first unless the prompt starts with one.
        transcoders: one `Transcoder` per layer or a `CrossLayerTranscoder` (as `attribute` takes them).
        interventions: `(layer, pos, feature, value)` tuples; pos an int, slice or tensor of positions.
        constrained_layers: layers whose MLP outputs are held at the clean run's (plus the change of
            the transcoders' skip term) and which alone take the interventions' decoder rows, each
            intervention moving its feature from its clean reading; all layers: every LayerNorm scale is
            held too (direct effects only). Attention patterns are then held whatever freeze_attention.
        freeze_attention: hold the attention patterns at the clean run's (when there is an intervention).
        apply_activation_function: False to return the pre-activations instead.
        sparse: return the activations as a sparse (COO, coalesced) tensor.
        return_activations: False to return None for the activations.
    """
    caller = "feature_intervention"
    flags = {
        "freeze_attention": freeze_attention,
        "apply_activation_function": apply_activation_function,
        "sparse": sparse,
        "return_activations": return_activations,
    }
    tokens, readers, spliced, by_layer = _setup(caller, model, prompt, transcoders, interventions, flags)
    constrained = _check_constrained(constrained_layers, model.cfg.n_layers, caller)
    run = _Run(model, readers, by_layer, {}, return_activations, apply_activation_function)
    with model.transcoders(spliced, use_error_term=True):
        if (freeze_attention or constrained is not None) and by_layer:
            run.freeze(tokens, constrained)
        logits = model.run_with_hooks(tokens[None], fwd_hooks=run.hooks())
    return logits, run.activations(sparse) if return_activations else None


@torch.no_grad()
def feature_intervention_generate(
    model: Any,
    prompt: str | Tensor | list[int],
    transcoders: Any,
    interventions: Sequence[tuple[Any, Any, Any, Any]],
    *,
    max_new_tokens: int,
    do_sample: bool = False,
    constrained_layers: range | Sequence[int] | None = None,
    freeze_attention: bool = True,
    apply_activation_function: bool = True,
    sparse: bool = False,
    return_activations: bool = True,
    **generate_kwargs: Any,
) -> tuple[Any, Tensor, Tensor | None]:
    """Continue `prompt` with `interventions` held (see the module's docs): returns the generation (text
    for a text prompt, else the token ids `[1, pos + new]`, as `model.generate` returns them), the logits
    of each generation step `[new, d_vocab]` and the readings `[n_layers, pos + new - 1, d_sae]` (None
    with `return_activations=False`). The first step carries every intervention, with the attention
    patterns frozen if `freeze_attention` (and `constrained_layers` as in `feature_intervention`); each
    later token carries the open-ended ones (`pos` a slice
    with no stop). `generate_kwargs` go to `model.generate` (temperature, top_k, top_p, seed,
    stop_at_eos, eos_token_id); it always uses its key/value cache.
    """
    caller = "feature_intervention_generate"
    flags = {
        "do_sample": do_sample,
        "freeze_attention": freeze_attention,
        "apply_activation_function": apply_activation_function,
        "sparse": sparse,
        "return_activations": return_activations,
    }
    for bad in ("use_past_kv_cache", "return_type", "prepend_bos", "input"):
        if bad in generate_kwargs:
            raise TypeError(
                f"{caller}: {bad}= is not taken (it always uses the key/value cache on the prompt's tokens)"
            )
    check_int_in_range(max_new_tokens, "max_new_tokens", 0, None, caller=caller)
    tokens, readers, spliced, by_layer = _setup(caller, model, prompt, transcoders, interventions, flags)
    constrained = _check_constrained(constrained_layers, model.cfg.n_layers, caller)
    if tokens.shape[0] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(
            f"{caller}: prompt is {tokens.shape[0]} tokens (BOS included); with max_new_tokens={max_new_tokens} "
            f"that passes the model's context of {model.cfg.n_ctx}"
        )
    open_ended: dict[int, list[tuple[Any, Any, Any]]] = {}
    for layer, items in by_layer.items():
        kept = [(p, f, v) for p, f, v in items if isinstance(p, slice) and p.stop is None]
        if kept:
            open_ended[layer] = kept
    run = _Run(model, readers, by_layer, open_ended, return_activations, apply_activation_function)
    run.n_prompt = tokens.shape[0]
    with model.transcoders(spliced, use_error_term=True):
        if (freeze_attention or constrained is not None) and by_layer:
            run.freeze(tokens, constrained)
        with model.hooks(fwd_hooks=run.hooks()):
            out = model.generate(
                tokens[None],
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                use_past_kv_cache=True,
                return_type="tokens",
                **generate_kwargs,
            )
    logits = torch.cat([run.logits[0][:, -1:]] + run.logits[1:], dim=1)[0] if run.logits else torch.empty(0)
    generation: Any = out
    if isinstance(prompt, str):
        generation = model.tokenizer.decode(out[0].tolist(), skip_special_tokens=True)
    return generation, logits, run.activations(sparse) if return_activations and run.logits else None
