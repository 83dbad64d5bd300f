"""ActivationCache: the activations a `run_with_cache` call stored, by hook name.

Besides indexing, the cache splits the residual stream into the pieces that wrote it,
as transformer-lens' `ActivationCache` does (same method names, arguments, defaults,
labels and results):

    accumulated_resid        the residual stream entering each layer (logit lens)
    decompose_resid          embed, pos_embed, and each layer's attn_out / mlp_out
    stack_head_results       each head's output (hook_z @ W_O, without b_O)
    stack_neuron_results     each neuron's output (hook_post * W_out row, without b_out)
    get_full_resid_decomposition   heads + neurons (or mlp_out) + embeds + biases
    apply_ln_to_stack        scale a stack as the LayerNorm of a layer scaled the whole stream
    logit_attrs              the stack's contribution to the logit of some tokens

`layer` in these methods is where the stack stops: the input to block `layer`, with
`n_layers` (also -1 or None) the input to the unembed. Other negative values count back
from there (-2 is the input to the last block). `pos_slice` picks positions as
transformer-lens' `Slice` does (see slices.py): None (all), an int (drops the axis), a slice, a
`(start, stop[, step])` tuple, a list / tensor of indices, or a `Slice` (ours or transformer-lens').
"""

from __future__ import annotations

import warnings
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Literal, Union

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .checks import check_int
from .slices import SliceInput
from .slices import keep_axis as _keep_axis
from .slices import slice_index as _index
from .slices import take as _take
from .utils import get_act_name

__all__ = ["TokensInput", "Stack", "ActivationCache", "check_int", "get_act_name"]

TokensInput = Union[str, int, Int[Tensor, "..."]]
Stack = Float[Tensor, "component *batch_and_pos d_model"]


class ActivationCache(Mapping[str, Tensor]):
    """A read-only mapping from hook name to cached activation, with transformer-lens'
    residual-stream tools.

    Indexing takes full names or transformer-lens' short forms, with negative
    layers counting from the end:

    Example:
        >>> logits, cache = model.run_with_cache("Hello world")
        >>> cache["blocks.0.attn.hook_pattern"] is cache["pattern", 0]
        True
        >>> cache["scale", 1, "ln1"]; cache["resid_post", -1]
        >>> resid, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)
    """

    def __init__(self, cache_dict: dict[str, Tensor], model: Any, has_batch_dim: bool = True) -> None:
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim

    # ----- the mapping -----------------------------------------------------
    def _key(self, key: str | tuple) -> str:
        if isinstance(key, str):  # a full name, else a short one ("embed", "pre1", "scale")
            return key if key in self.cache_dict else get_act_name(key)
        if isinstance(key, tuple) and key and isinstance(key[0], str):
            name, *rest = key
            layer = rest[0] if rest else None
            if layer is not None:
                n_layers = self.model.cfg.n_layers
                try:  # an int, a numpy int or a 0-d integer tensor (as a loop over torch.arange gives)
                    layer = check_int(layer, "layer")
                except TypeError:
                    raise KeyError(
                        f"cache[{key!r}]: layer {layer!r} is not an int, layers are 0..{n_layers - 1}"
                    ) from None
                if not -n_layers <= layer < n_layers:
                    raise KeyError(f"cache[{key!r}]: layer {layer!r} is out of range, layers are 0..{n_layers - 1}")
                layer %= n_layers
            return get_act_name(name, layer, rest[1] if len(rest) > 1 else None)
        raise KeyError(f"cache key must be a hook name or a (name, layer[, layer_type]) tuple, got {key!r}")

    def __getitem__(self, key: str | tuple) -> Tensor:
        name = self._key(key)
        if name not in self.cache_dict:
            stored = list(self.cache_dict)
            shown = ", ".join(stored[:12]) + (f", ... ({len(stored)} in all)" if len(stored) > 12 else "")
            raise KeyError(f"the cache holds no {name!r} (asked as {key!r}); it holds: {shown}. {self._fix(name)}")
        return self.cache_dict[name]

    def _fix(self, name: str) -> str:
        """How to get `name` into a cache."""
        base = name.removesuffix("_grad")
        if name.endswith("attn.hook_result"):
            return "Call cache.compute_head_results(), or model.set_use_attn_result(True) before run_with_cache."
        if hasattr(self.model, "_unknown_hook_error") and base not in self.model.hook_dict:  # a typo, or opt-in and off
            msg = self.model._unknown_hook_error(base).args[0]
            return msg[0].upper() + msg[1:] + ("" if msg.endswith(("?", ".")) else ".")
        grad = " with incl_bwd=True" if name.endswith("_grad") else ""
        return f"Run model.run_with_cache{grad} without names_filter, or with a names_filter that keeps {base!r}."

    def __contains__(self, key: object) -> bool:
        try:
            return self._key(key) in self.cache_dict  # type: ignore[arg-type]
        except KeyError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def keys(self) -> KeysView[str]:
        """The cached hook names, in the order they ran."""
        return self.cache_dict.keys()

    def values(self) -> ValuesView[Tensor]:
        """The cached activations, in the order of `keys()`."""
        return self.cache_dict.values()

    def items(self) -> ItemsView[str, Tensor]:
        """(hook name, activation) pairs, in the order they ran."""
        return self.cache_dict.items()

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"

    def to(self, device: torch.device | str) -> ActivationCache:
        """Move every cached tensor to `device` (in place) and return self."""
        self.cache_dict = {k: v.to(device) for k, v in self.cache_dict.items()}
        return self

    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch axis of a batch-1 cache (in place) and return self."""
        if not self.has_batch_dim:
            return self
        for name, t in self.cache_dict.items():
            if t.shape[0] != 1:
                raise ValueError(f"remove_batch_dim: {name} has batch size {t.shape[0]}; only a batch of 1 can drop it")
        self.cache_dict = {k: v[0] for k, v in self.cache_dict.items()}
        self.has_batch_dim = False
        return self

    def apply_slice_to_batch_dim(self, batch_slice: Any) -> ActivationCache:
        """A new cache holding the prompts `batch_slice` picks (an int drops the batch axis, as
        transformer-lens does; a slice, tuple, list or tensor of indices keeps it)."""
        if not self.has_batch_dim:
            raise ValueError("apply_slice_to_batch_dim: this cache has no batch axis (remove_batch_dim was applied)")
        idx = _index(batch_slice, "batch_slice")
        sizes = {t.shape[0] for t in self.cache_dict.values()}
        if isinstance(idx, int) and sizes and not all(-n <= idx < n for n in sizes):
            raise ValueError(f"batch_slice={idx} is out of range for a batch of {max(sizes)}")
        sliced = {name: _take(t, idx, 0) for name, t in self.cache_dict.items()}
        return ActivationCache(sliced, self.model, has_batch_dim=not isinstance(idx, int))

    @staticmethod
    def toggle_autodiff(mode: bool = False) -> None:
        """`torch.set_grad_enabled(mode)` for the whole process, as transformer-lens' method does.
        (Global state: `with torch.no_grad():` or `torch.inference_mode()` are the local ways.)"""
        if not isinstance(mode, bool):
            raise TypeError(f"toggle_autodiff: mode must be True or False, got {mode!r}")
        warnings.warn(f"toggle_autodiff: autograd is now {'on' if mode else 'off'} for the whole process", stacklevel=2)
        torch.set_grad_enabled(mode)

    # ----- shared checks ----------------------------------------------------
    def _layer(self, layer: int | None, arg: str = "layer") -> int:
        """`layer` as a number in 0..n_layers, where n_layers (or -1, None) means the unembed's input."""
        n = self.model.cfg.n_layers
        if layer is None:
            return n
        value = check_int(layer, arg)
        if not -(n + 1) <= value <= n:
            raise ValueError(
                f"{arg}={layer!r} is out of range: layers are 0..{n - 1}, and {n} (or -1, or None) "
                f"means everything up to the unembed; other negative values count back from {n}"
            )
        return value % (n + 1)

    def _check_mlp_input(self, layer: int, mlp_input: bool) -> None:
        if mlp_input and self.model.cfg.attn_only:
            raise ValueError("mlp_input=True: this model has attn_only=True, so no MLP (and no resid_mid)")
        if mlp_input and layer == self.model.cfg.n_layers:
            raise ValueError(
                "mlp_input=True asks for the input to the MLP of `layer`, so layer must be "
                f"0..{layer - 1}; layer={layer} (or -1, None) is the input to the unembed"
            )

    def _ln_scale(self, layer: int, mlp_input: bool, pos: Any, batch: Any = None) -> Float[Tensor, "*batch_and_pos 1"]:
        """The cached scale of the LayerNorm that reads the residual stream at `layer`."""
        if layer == self.model.cfg.n_layers:
            key = "ln_final.hook_scale"
        else:
            key = f"blocks.{layer}.ln{2 if mlp_input else 1}.hook_scale"
        if key not in self.cache_dict:
            raise KeyError(
                f"apply_ln needs the cached LayerNorm scale {key!r}, which this cache does not hold: "
                f"run model.run_with_cache without names_filter, or with one that keeps {key!r}"
            )
        scale = _take(self.cache_dict[key], pos, -2)
        if batch is not None and self.has_batch_dim:
            scale = _take(scale, batch, 0)
        return scale

    def _final_ln(self, stack: Stack) -> Stack:
        """ln_final applied to each component on its own (statistics recomputed per component)."""
        ln = self.model.ln_final
        if self.model.cfg.normalization_type is None:
            return stack
        x = stack - stack.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt()
        if ln.has_params:  # unprocessed weights: the LayerNorm's own w and b
            x = x * ln.w.detach() + ln.b.detach()
        return x

    def _resid_at(self, layer: int | None, mlp_input: bool, pos_slice: SliceInput) -> tuple[int, Any]:
        """The start of every residual-stream decomposition: `layer` resolved (None and -1: the
        unembed) and checked against `mlp_input`, and the index `pos_slice` takes."""
        layer = self._layer(layer)
        self._check_mlp_input(layer, mlp_input)
        return layer, _index(pos_slice, "pos_slice")

    def _components(
        self,
        stack: Stack,
        labels: list[str],
        layer: int,
        mlp_input: bool,
        pos_slice: SliceInput,
        apply_ln: bool,
        return_labels: bool,
    ) -> Stack | tuple[Stack, list[str]]:
        """The end of every decomposition: with `apply_ln` each component scaled by the LayerNorm
        that reads the stream at `layer` (`apply_ln_to_stack`); the labels too if `return_labels`."""
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        return (stack, labels) if return_labels else stack

    def _stack_layers(
        self, results: list[Tensor], labels: list[str], layer: int, pos: Any, incl_remainder: bool
    ) -> Stack:
        """Per-layer results `[..., component, d_model]` as one stack `[component, ..., d_model]`
        (empty if there are none); `incl_remainder` adds resid_post of `layer - 1` minus their sum."""
        if results:
            stack = einops.rearrange(torch.cat(results, dim=-2), "... component d_model -> component ... d_model")
        else:
            stack = self._empty(pos)
        if incl_remainder:
            resid = _take(self["resid_post", layer - 1], pos, -2)
            stack = torch.cat([stack, (resid - stack.sum(0))[None]])
            labels.append("remainder")
        return stack

    # ----- residual stream --------------------------------------------------
    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: SliceInput = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream entering each layer up to `layer`: labels `"0_pre"`, `"1_pre"`, ...,
        `"final_post"` (the input to ln_final), with `"L_mid"` entries too if `incl_mid`.

        `mlp_input`: end with resid_mid of `layer` (the MLP's input). `apply_ln`: at the unembed
        (the default layer), apply ln_final to each entry with its own statistics (and ln_final's
        w and b on unprocessed weights): the logit lens; at an earlier layer, centre and divide
        by that layer's cached ln1 (ln2 with `mlp_input`) scale, as `apply_ln_to_stack` does.

        Example:
            >>> resid, labels = cache.accumulated_resid(apply_ln=True, pos_slice=-1, return_labels=True)
            >>> layer_logits = resid @ model.W_U        # [component, batch, d_vocab]: the logit lens
        """
        n = self.model.cfg.n_layers
        layer, pos = self._resid_at(layer, mlp_input, pos_slice)
        if incl_mid and self.model.cfg.attn_only:
            raise ValueError("incl_mid=True: this model has attn_only=True, so no resid_mid")
        parts, labels = [], []
        for L in range(layer):
            parts.append(self["resid_pre", L])
            labels.append(f"{L}_pre")
            if incl_mid:
                parts.append(self["resid_mid", L])
                labels.append(f"{L}_mid")
        if layer == n:
            parts.append(self["resid_post", n - 1])
            labels.append("final_post")
        else:
            parts.append(self["resid_pre", layer])
            labels.append(f"{layer}_pre")
            if mlp_input:
                parts.append(self["resid_mid", layer])
                labels.append(f"{layer}_mid")
        stack = torch.stack([_take(p, pos, -2) for p in parts])
        if apply_ln and layer == n:  # the logit lens: ln_final with each entry's own statistics
            stack, apply_ln = self._final_ln(stack), False
        return self._components(stack, labels, layer, mlp_input, pos_slice, apply_ln, return_labels)

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: Literal["all", "mlp", "attn"] = "all",
        apply_ln: bool = False,
        pos_slice: SliceInput = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream at `layer` split into what wrote it: `"embed"`, `"pos_embed"`,
        then `"L_attn_out"` and `"L_mlp_out"` for each layer before it (and `layer`'s attn_out
        with `mlp_input`). `mode` keeps only "attn" or "mlp" outputs. Summed, the components
        give resid_pre of `layer` (resid_mid with `mlp_input`, the final resid_post at the end).

        Example:
            >>> parts, labels = cache.decompose_resid(layer=1, return_labels=True)
            >>> torch.allclose(parts.sum(0), cache["resid_pre", 1], atol=1e-5)
            True
        """
        if mode not in ("all", "mlp", "attn"):
            raise ValueError(f"mode={mode!r}, expected 'all', 'mlp' or 'attn'")
        layer, pos = self._resid_at(layer, mlp_input, pos_slice)
        parts, labels = [], []
        if incl_embeds:
            parts += [self["hook_embed"]] + ([] if self._shortformer else [self["hook_pos_embed"]])
            labels += ["embed"] + ([] if self._shortformer else ["pos_embed"])
        for L in range(layer):
            if mode != "mlp":
                parts.append(self["attn_out", L])
                labels.append(f"{L}_attn_out")
            if mode != "attn" and not self.model.cfg.attn_only:
                parts.append(self["mlp_out", L])
                labels.append(f"{L}_mlp_out")
        if mlp_input and mode != "mlp":
            parts.append(self["attn_out", layer])
            labels.append(f"{layer}_attn_out")
        stack = torch.stack([_take(p, pos, -2) for p in parts]) if parts else self._empty(pos)
        return self._components(stack, labels, layer, mlp_input, pos_slice, apply_ln, return_labels)

    @property
    def _shortformer(self) -> bool:
        """A shortformer model's pos_embed never enters the residual stream (it feeds each layer's
        queries and keys): the decompositions leave it out, so their parts still sum to the stream.
        (transformer-lens lists it anyway.)"""
        return self.model.cfg.positional_embedding_type == "shortformer"

    def _empty(self, pos: Any) -> Stack:
        """A stack of no components, shaped like the (position-sliced) residual stream."""
        like = _take(self["hook_embed"], pos, -2)
        return like.new_zeros((0, *like.shape))

    # ----- heads ------------------------------------------------------------
    def compute_head_results(self) -> None:
        """Add each head's output, `blocks.L.attn.hook_result` [batch, pos, head, d_model], to the
        cache: hook_z times W_O, without b_O (as transformer-lens). Layers that already have it
        (e.g. cached with `model.set_use_attn_result(True)`) are kept."""
        want_ndim = 4 if self.has_batch_dim else 3
        for L in range(self.model.cfg.n_layers):
            key = f"blocks.{L}.attn.hook_result"
            if key in self.cache_dict and self.cache_dict[key].ndim == want_ndim:
                continue
            z = self["z", L]
            W_O = self.model.blocks[L].attn.W_O.detach().to(z.device, z.dtype)
            self.cache_dict[key] = einops.einsum(
                z, W_O, "... n_heads d_head, n_heads d_head d_model -> ... n_heads d_model"
            )

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: SliceInput = None,
        apply_ln: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """Every head's output in the layers before `layer`, as components `"L0H0"`, `"L0H1"`, ...
        (b_O is not in them). `incl_remainder` adds `"remainder"`: resid_post of `layer - 1` minus
        the heads (for layer 0 that wraps to the last layer, as in transformer-lens). Computes the
        head results first if the cache lacks them.

        Example:
            >>> heads, labels = cache.stack_head_results(pos_slice=-1, return_labels=True)
            >>> heads.shape    # [n_layers * n_heads, batch, d_model]
        """
        layer = self._layer(layer)
        pos = _index(pos_slice, "pos_slice")
        self.compute_head_results()
        labels = [f"L{L}H{h}" for L in range(layer) for h in range(self.model.cfg.n_heads)]
        results = [_take(self["result", L], pos, -3) for L in range(layer)]  # [..., head, d_model]
        stack = self._stack_layers(results, labels, layer, pos, incl_remainder)
        return self._components(stack, labels, layer, False, pos_slice, apply_ln, return_labels)

    def stack_activation(
        self, activation_name: str, layer: int = -1, sublayer_type: str | None = None
    ) -> Float[Tensor, "layer ..."]:
        """One activation of every layer before `layer`, stacked: e.g. `stack_activation("pattern")`
        is [n_layers, batch, head, q_pos, k_pos]. `sublayer_type` picks e.g. "ln1" for "scale"."""
        layer = self._layer(layer)
        if layer == 0:
            raise ValueError("stack_activation: layer=0 stacks the layers before 0, i.e. none")
        return torch.stack([self[activation_name, L, sublayer_type] for L in range(layer)])

    # ----- neurons ----------------------------------------------------------
    def get_neuron_results(
        self, layer: int, neuron_slice: SliceInput = None, pos_slice: SliceInput = None
    ) -> Float[Tensor, "*batch_and_pos neuron d_model"]:
        """Each neuron's output in `layer`: hook_post times its row of W_out (without b_out)."""
        post = _take(self["post", layer], _index(pos_slice, "pos_slice"), -2)
        W_out = self.model.blocks[layer].mlp.W_out.detach().to(post.device, post.dtype)
        neurons = _keep_axis(_index(neuron_slice, "neuron_slice"))
        return _take(post, neurons, -1)[..., None] * _take(W_out, neurons, 0)

    def stack_neuron_results(
        self,
        layer: int,
        pos_slice: SliceInput = None,
        neuron_slice: SliceInput = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """Every MLP neuron's output in the layers before `layer`, as components `"L0N0"`, `"L0N1"`,
        ... (b_out is not in them). `neuron_slice` picks neurons in each layer (an int keeps one).
        `incl_remainder` adds `"remainder"`: resid_post of `layer - 1` minus the neurons.

        Example:
            >>> neurons, labels = cache.stack_neuron_results(2, pos_slice=-1, return_labels=True)
        """
        layer = self._layer(layer)
        pos = _index(pos_slice, "pos_slice")
        ids = _take(torch.arange(self.model.cfg.d_mlp), _keep_axis(_index(neuron_slice, "neuron_slice")), 0).tolist()
        labels = [f"L{L}N{i}" for L in range(layer) for i in ids]
        results = [self.get_neuron_results(L, neuron_slice, pos_slice) for L in range(layer)]
        stack = self._stack_layers(results, labels, layer, pos, incl_remainder)
        return self._components(stack, labels, layer, False, pos_slice, apply_ln, return_labels)

    # ----- LayerNorm and logits ---------------------------------------------
    def apply_ln_to_stack(
        self,
        residual_stack: Stack,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: SliceInput = None,
        batch_slice: SliceInput = None,
        has_batch_dim: bool = True,
    ) -> Stack:
        """Scale each component as the LayerNorm reading the stream at `layer` scaled the whole
        stream: centre each component, then divide by that LayerNorm's cached `hook_scale` (ln1 of
        `layer`, ln2 with `mlp_input`, ln_final for the default layer). The LayerNorm's w and b are
        not applied (as in transformer-lens; with processed weights they are folded away).

        `pos_slice` / `batch_slice`: the slices already taken of the stack's position / batch
        axes, applied here to the cached scale (`batch_slice` is also taken of the stack's batch
        axis, axis 1, if `has_batch_dim`).

        Example:
            >>> parts = cache.decompose_resid(pos_slice=-1)
            >>> scaled = cache.apply_ln_to_stack(parts, pos_slice=-1)  # sums to ln_final's output
        """
        layer = self._layer(layer)
        self._check_mlp_input(layer, mlp_input)
        pos, batch = _index(pos_slice, "pos_slice"), _index(batch_slice, "batch_slice")
        if has_batch_dim:
            residual_stack = _take(residual_stack, batch, 1)
        if self.model.cfg.normalization_type is None:  # no LayerNorm reads the stream: nothing to apply
            return residual_stack
        scale = self._ln_scale(layer, mlp_input, pos, batch)
        try:
            fits = torch.broadcast_shapes(residual_stack.shape, scale.shape) == residual_stack.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"apply_ln_to_stack: a stack of shape {tuple(residual_stack.shape)} does not fit the cached "
                f"scale of shape {tuple(scale.shape)} (after pos_slice={pos_slice!r}, batch_slice={batch_slice!r}); "
                "pass the pos_slice / batch_slice the stack was made with, and has_batch_dim"
            )
        centred = residual_stack - residual_stack.mean(-1, keepdim=True)
        return centred / scale

    def _residual_directions(self, tokens: TokensInput, arg: str) -> Float[Tensor, "... d_model"]:
        """The unembedding column of each token (the model's tokens_to_residual_directions)."""
        return self.model.tokens_to_residual_directions(tokens, arg=arg).detach()

    def logit_attrs(
        self,
        residual_stack: Stack,
        tokens: TokensInput,
        incorrect_tokens: TokensInput | None = None,
        pos_slice: SliceInput = None,
        batch_slice: SliceInput = None,
        has_batch_dim: bool = True,
    ) -> Float[Tensor, " component *batch_and_pos"]:
        """Each component's direct contribution to the logit of `tokens` (minus that of
        `incorrect_tokens`, if given): ln_final's cached scale applied (`apply_ln_to_stack`), then
        the dot product with the tokens' unembedding columns. b_U is not included, nor ln_final's w
        and b (fold them in with processed weights for attributions that sum to the logits).

        `tokens`: a token string, an id, or ids of shape [batch] (one per example, broadcast over
        positions) or [batch, pos]. `pos_slice` / `batch_slice`: as in `apply_ln_to_stack`.

        Example:
            >>> parts, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)
            >>> attrs = cache.logit_attrs(parts, " him", " her", pos_slice=-1)  # [component, batch]
        """
        directions = self._residual_directions(tokens, "tokens")
        if incorrect_tokens is not None:
            wrong = self._residual_directions(incorrect_tokens, "incorrect_tokens")
            if directions.shape != wrong.shape:
                raise ValueError(
                    f"tokens and incorrect_tokens must have the same shape, got {tuple(directions.shape[:-1])} "
                    f"and {tuple(wrong.shape[:-1])}"
                )
            directions = directions - wrong
        scaled = self.apply_ln_to_stack(
            residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim
        )
        if has_batch_dim and scaled.ndim == 4 and directions.ndim == 2 and directions.shape[0] == scaled.shape[1]:
            directions = directions[:, None]  # one token per example: the same for every position
        return (scaled * directions).sum(-1)

    # ----- the full decomposition -------------------------------------------
    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: SliceInput = None,
        return_labels: bool = False,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream at `layer` split as finely as it goes: every head (`"L0H0"`...),
        every neuron (`"L0N0"`...; or each layer's `"L_mlp_out"` if not `expand_neurons`),
        `"embed"`, `"pos_embed"`, and `"bias"` (the b_O, and b_out with `expand_neurons`, of the
        layers before). The components sum to the residual stream at `layer`.

        Example:
            >>> parts, labels = cache.get_full_resid_decomposition(pos_slice=-1, return_labels=True)
            >>> torch.allclose(parts.sum(0), cache["resid_post", -1][:, -1], atol=1e-4)
            True
        """
        layer, pos = self._resid_at(layer, mlp_input, pos_slice)
        heads, labels = self.stack_head_results(layer + int(mlp_input), pos_slice=pos_slice, return_labels=True)
        parts = [heads]
        if layer > 0 and not self.model.cfg.attn_only:
            if expand_neurons:
                mlps, mlp_labels = self.stack_neuron_results(layer, pos_slice=pos_slice, return_labels=True)
            else:
                mlps, mlp_labels = self.decompose_resid(
                    layer, mlp_input, mode="mlp", pos_slice=pos_slice, incl_embeds=False, return_labels=True
                )
            parts.append(mlps)
            labels += mlp_labels
        embeds = ["embed"] + ([] if self._shortformer else ["pos_embed"])
        parts += [_take(self[f"hook_{e}"], pos, -2)[None] for e in embeds]
        bias = self.model.accumulated_bias(layer, mlp_input, include_mlp_biases=expand_neurons).detach()
        parts.append(bias.to(heads.device, heads.dtype).expand(1, *heads.shape[1:]))
        labels += embeds + ["bias"]
        return self._components(torch.cat(parts), labels, layer, mlp_input, pos_slice, apply_ln, return_labels)
