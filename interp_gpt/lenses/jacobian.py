"""The Jacobian lens, fitted as transformer-lens 4.3's `JacobianLens.fit` fits it.

The lens (Gurnee et al., "Verbalizable Representations Form a Global Workspace in Language Models",
Transformer Circuits Thread, 2026) maps the residual stream leaving block l to the one leaving the
last block L-1, before `ln_final`, by one matrix per layer averaged over a corpus:

    J[l] = mean over prompts of (1/|V|) sum_{t in V} sum_{t' in V, t' >= t} d h_{L-1, t'} / d h_{l, t}

where V holds the positions `skip_first_positions .. seq_len - 2` (the first ones and the last one
are left out). A vector h of layer l reads `ln_final(J[l] h) @ W_U + b_U`; J = I is the logit lens.

The phases, for each prompt (the reference's order): 1. tokens (BOS first, cut to `max_seq_len`, the
last position dropped); 2. prefix: the positions before `skip_first_positions` run once without
gradients, into a `KVCache`; 3. forward: the valid positions, `dim_batch` copies, from a leaf at the
lowest source layer's `resid_post` up to the target (no `ln_final`); 4. backward: `ceil(d_model /
dim_batch)` vector-Jacobian products, one-hot cotangents at every valid target, for all source layers at
once; 5. average: over the valid source positions (float32), then over prompts.

Example:
    >>> from interp_gpt.lenses import jacobian_lens
    >>> lens = jacobian_lens(model, ["The cat sat on the mat because it was tired."], skip_first_positions=2)
    >>> lens.J.shape == (model.cfg.n_layers - 1, model.cfg.d_model, model.cfg.d_model)
    True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from ..checks import check_int, check_int_in_range, check_token_ids, check_type
from ..model.generation import KVCache
from ..model.gpt import GPT
from ..prepare import checked_model
from .grad import check_not_inference
from .logit import readout

__all__ = ["JacobianLens", "jacobian_lens"]

_SPLICED_WHY = (
    "the lens is fitted on the model's own residual stream, and gradients would pass through the spliced "
    "module: take it out with model.reset_saes()"
)


class JacobianLens:
    """A fitted Jacobian lens: one `[d_model, d_model]` matrix per source layer (transformer-lens 4.3's
    `JacobianLens`, its `jacobians` stacked).

    `J [n_source_layers, d_model, d_model]` (float32): `J[i]` maps `resid_post` of layer
    `source_layers[i]` to `resid_post` of the last layer, before `ln_final`. The last layer's own lens is
    the identity (it is never fitted). `n_prompts`: how many prompts the average holds.

    Example:
        >>> lens = jacobian_lens(model, ["The cat sat on the mat."], skip_first_positions=2)
        >>> logits, cache = model.run_with_cache("The cat sat on the mat.")
        >>> lens(cache["blocks.0.hook_resid_post"], 0).shape == logits.shape
        True
    """

    def __init__(self, model: GPT, J: Tensor, source_layers: Sequence[int], n_prompts: int) -> None:
        caller = "JacobianLens"
        self.model = check_type(model, GPT, "model", "an interp_gpt GPT", caller)
        check_type(J, Tensor, "J", "a tensor [n_source_layers, d_model, d_model]", caller)
        layers = [check_int(layer, "source_layers", caller) for layer in source_layers]
        d, n = model.cfg.d_model, model.cfg.n_layers
        if J.shape != (len(layers), d, d):
            raise ValueError(
                f"{caller}: J has shape {tuple(J.shape)}, expected ({len(layers)}, {d}, {d}) "
                "(one [d_model, d_model] matrix per source layer)"
            )
        if len(set(layers)) != len(layers) or any(not 0 <= layer < n - 1 for layer in layers):
            raise ValueError(f"{caller}: source_layers={layers} must be distinct layers of 0..{n - 2}")
        self.J = J.detach().float()
        self.source_layers = layers
        self.n_prompts = n_prompts

    def __repr__(self) -> str:
        return (
            f"JacobianLens(source_layers={self.source_layers}, d_model={self.model.cfg.d_model}, "
            f"n_prompts={self.n_prompts})"
        )

    def matrix(self, layer: int) -> Float[Tensor, "d_model d_model"]:
        """The transport matrix of `layer` (negative counts from the end); the identity for the last layer.

        Example:
            >>> lens = jacobian_lens(model, ["The cat sat on the mat."], skip_first_positions=2)
            >>> bool((lens.matrix(-1) == torch.eye(model.cfg.d_model)).all())
            True
        """
        n = self.model.cfg.n_layers
        index = check_int(layer, "layer", "JacobianLens")
        index = index + n if -n <= index < 0 else index
        if index == n - 1:
            return torch.eye(self.model.cfg.d_model)
        if index not in self.source_layers:
            raise ValueError(
                f"JacobianLens: layer={layer!r} has no matrix: the lens has source layers {self.source_layers} "
                f"and the last layer, {n - 1} (the identity)"
            )
        return self.J[self.source_layers.index(index)]

    def transport(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        """`resid_post` of `layer` moved to the last layer's basis: `J[layer] h` for every vector, in float32.

        Example:
            >>> lens = jacobian_lens(model, ["The cat sat on the mat."], skip_first_positions=2)
            >>> lens.transport(torch.zeros(3, model.cfg.d_model), 0).shape
            torch.Size([3, 128])
        """
        matrix = self.matrix(layer)
        d = self.model.cfg.d_model
        check_type(resid, Tensor, "resid", "a tensor [..., d_model]", "JacobianLens")
        if not resid.is_floating_point() or resid.ndim == 0 or resid.shape[-1] != d:
            raise ValueError(
                f"JacobianLens: resid has shape {tuple(resid.shape)} and dtype {resid.dtype}, "
                f"expected a float tensor [..., {d}] (d_model)"
            )
        return resid.float() @ matrix.to(resid.device).T

    def __call__(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_vocab"]:
        """The lens' logits for `resid_post` vectors of `layer`: `ln_final(J[layer] h) @ W_U + b_U`."""
        return readout(self.model, self.transport(resid, layer))


@contextmanager
def _frozen(model: GPT) -> Iterator[None]:
    """No parameter asks for a gradient in here, so the graph starts at the leaf hook puts in (the reference
    freezes its weights the same way); each flag is put back however the block ends."""
    saved = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in saved:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)


class _Slope(torch.autograd.Function):
    """The MLP's activation with its derivative computed once: `post` forward, `grad * slope` backward. Every
    backward pass runs through the same activations, so one multiply replaces the activation's own backward."""

    @staticmethod
    def forward(ctx: Any, pre: Tensor, post: Tensor, slope: Tensor) -> Tensor:
        ctx.save_for_backward(slope)
        return post.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (slope,) = ctx.saved_tensors
        return grad * slope, None, None


def _slope_hooks(model: GPT, layers: range) -> list[tuple[str, Any]]:
    """Hooks on `mlp.hook_pre` / `hook_post` of `layers` that give the activation a precomputed derivative
    (`_Slope`); the activation is elementwise (every `cfg.act_fn` is), so its derivative is one vector-Jacobian
    product with ones."""
    pres: dict[int, Tensor] = {}

    def keep_pre(pre: Tensor, hook: Any) -> None:
        pres[hook.layer()] = pre

    def linearize(post: Tensor, hook: Any) -> Tensor:
        pre = pres.pop(hook.layer())
        with torch.enable_grad():
            x = pre.detach().requires_grad_(True)
            (slope,) = torch.autograd.grad(model.blocks[hook.layer()].mlp.act_fn(x), x, torch.ones_like(x))
        return _Slope.apply(pre, post.detach(), slope)

    hooks = [(f"blocks.{i}.mlp.hook_pre", keep_pre) for i in layers]
    return hooks + [(f"blocks.{i}.mlp.hook_post", linearize) for i in layers]


class _Stop(Exception):
    """Raised by the hook on the target: the forward ends there (no ln_final, no unembedding)."""


def _prefix_cache(model: GPT, prefix: Tensor, copies: int) -> KVCache:
    """Keys and values of the prefix positions at every layer, `copies` times along the batch."""
    n = model.cfg.n_layers
    keys: dict[int, Tensor] = {}
    values: dict[int, Tensor] = {}

    def keep(store: dict[int, Tensor]) -> Any:
        def fn(t: Tensor, hook: Any) -> None:
            store[hook.layer()] = t

        return fn

    hooks = [(f"blocks.{i}.attn.hook_k", keep(keys)) for i in range(n)]
    hooks += [(f"blocks.{i}.attn.hook_v", keep(values)) for i in range(n)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(prefix[None], stop_at_layer=n)
    kv = KVCache(n)
    kv.keys = [keys[i].expand(copies, -1, -1, -1) for i in range(n)]
    kv.values = [values[i].expand(copies, -1, -1, -1) for i in range(n)]
    kv.attention_mask = torch.ones(copies, prefix.shape[0], dtype=torch.long, device=prefix.device)
    return kv


def _prompt_jacobians(
    model: GPT, ids: Tensor, sources: list[int], skip: int, dim_batch: int
) -> Float[Tensor, "source d_model d_model"]:
    """One prompt's matrices, averaged over its valid source positions (phases 2 to 5 above)."""
    n, d = model.cfg.n_layers, model.cfg.d_model
    ids = ids[:-1]  # phase 1's last step: the last position is neither a source nor a target
    copies = min(dim_batch, d)
    kv = _prefix_cache(model, ids[:skip], copies) if skip > 0 else None

    captured: dict[str, Tensor] = {}

    def leaf(resid: Tensor, hook: Any) -> Tensor:
        captured[hook.name] = x = resid.detach().requires_grad_(True)
        return x

    def keep(resid: Tensor, hook: Any) -> None:
        captured[hook.name] = resid

    def stop(resid: Tensor, hook: Any) -> None:
        captured[hook.name] = resid
        raise _Stop

    names = [f"blocks.{layer}.hook_resid_post" for layer in sources]
    target_name = f"blocks.{n - 1}.hook_resid_post"
    hooks = [(names[0], leaf), *[(name, keep) for name in names[1:]], (target_name, stop)]
    if not model.cfg.attn_only:
        hooks += _slope_hooks(model, range(sources[0] + 1, n))
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        try:
            model(ids[skip:].expand(copies, -1), return_type=None, past_kv_cache=kv)
        except _Stop:
            pass
    target = captured[target_name]  # [copies, n_valid, d_model]
    inputs = [captured[name] for name in names]

    out = torch.empty(len(sources), d, d, dtype=torch.float32)
    cotangent = torch.zeros_like(target)
    rows = torch.arange(copies, device=target.device)
    for start in range(0, d, copies):
        width = min(copies, d - start)
        cotangent.zero_()
        cotangent[rows[:width], :, start + rows[:width]] = 1.0  # copy b: output dim start + b, every target
        grads = torch.autograd.grad(target, inputs, cotangent, retain_graph=start + copies < d)
        for i, grad in enumerate(grads):
            out[i, start : start + width] = grad[:width].float().mean(dim=1).cpu()
    return out


def _prompt_ids(model: GPT, prompts: Any, max_seq_len: int, caller: str) -> list[Tensor]:
    """Each prompt's token ids `[pos]`, cut to `max_seq_len`: text through `model.to_tokens` (BOS first),
    token ids as given."""
    if isinstance(prompts, (str, Tensor)):
        prompts = [prompts] if isinstance(prompts, str) or prompts.ndim == 1 else list(prompts)
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(
            f"{caller}: prompts must be a list of strings, a tensor of token ids [n_prompts, pos] or a list "
            f"of [pos] tensors, got {type(prompts).__name__}"
        )
    if not prompts:
        raise ValueError(f"{caller}: prompts is empty; pass at least one prompt")
    out = []
    for i, prompt in enumerate(prompts):
        arg = f"prompts[{i}]"
        if isinstance(prompt, str):
            ids = model.to_tokens(prompt)[0]
        elif isinstance(prompt, Tensor) and prompt.ndim == 1 and not prompt.is_floating_point():
            ids = check_token_ids(prompt.long(), model.cfg.d_vocab, arg, caller)
        else:
            what = (
                f"a tensor of shape {tuple(prompt.shape)} and dtype {prompt.dtype}"
                if isinstance(prompt, Tensor)
                else type(prompt).__name__
            )
            raise TypeError(f"{caller}: {arg} is {what}; expected a string or token ids [pos]")
        ids = ids[:max_seq_len]
        if ids.shape[0] > model.cfg.n_ctx:
            raise ValueError(
                f"{caller}: {arg} has {ids.shape[0]} tokens, longer than the context of {model.cfg.n_ctx} "
                "(cfg.n_ctx); lower max_seq_len"
            )
        out.append(ids.to(model.W_E.device))
    return out


@torch.inference_mode(False)  # fits under a caller's torch.inference_mode() too (grad.py)
def jacobian_lens(
    model: GPT,
    prompts: Any,
    *,
    source_layers: Sequence[int] | None = None,
    dim_batch: int = 16,
    max_seq_len: int = 128,
    skip_first_positions: int = 16,
) -> JacobianLens:
    """Fit a Jacobian lens: transformer-lens 4.3's `JacobianLens.fit(bridge, prompts, ...)`, on our hook points.

    `prompts`: strings (each through `model.to_tokens`, BOS first, as the reference tokenizes them), a tensor
    of token ids `[n_prompts, pos]`, or a list of `[pos]` tensors (of any lengths; taken as given).
    `source_layers`: layers whose `resid_post` to fit (default every layer but the last; negative counts
    from the end). `dim_batch`: output dimensions per backward pass (the forward runs that many copies of
    the valid positions; more is faster on a big machine and holds more activations; the result is the
    same). `max_seq_len`: prompts are cut to this many tokens. `skip_first_positions`: sources and targets
    are positions `skip_first_positions .. seq_len - 2`, so every prompt needs more than
    `skip_first_positions + 1` tokens (the reference skips a shorter one with a warning; this refuses it).

    The model's weights are frozen while it runs (their `requires_grad` flags are put back after). The
    gradients are in the model's dtype, the averages and `J` in float32, as the reference's. It runs its own
    gradients under a caller's `torch.no_grad()` or `torch.inference_mode()` too.

    Example:
        >>> lens = jacobian_lens(model, ["The cat sat on the mat.", "A dog ran after the ball."], skip_first_positions=2)
        >>> lens
        JacobianLens(source_layers=[0], d_model=128, n_prompts=2)
        >>> lens(torch.randn(5, model.cfg.d_model), 0).shape == (5, model.cfg.d_vocab)
        True
    """
    caller = "jacobian_lens"
    model = checked_model(model, caller, splices="none", why=_SPLICED_WHY)
    check_not_inference(model.named_parameters(), "model", caller)
    n = model.cfg.n_layers
    if n < 2:
        raise ValueError(f"{caller}: the model has {n} layer; the lens maps a layer below the last to the last")
    dim_batch = check_int_in_range(dim_batch, "dim_batch", 1, None, caller=caller)
    max_seq_len = check_int_in_range(max_seq_len, "max_seq_len", 2, None, caller=caller)
    skip = check_int_in_range(skip_first_positions, "skip_first_positions", 0, None, caller=caller)
    sources = _source_layers(source_layers, n, caller)
    ids = _prompt_ids(model, prompts, max_seq_len, caller)
    for i, row in enumerate(ids):
        if row.shape[0] <= skip + 1:
            raise ValueError(
                f"{caller}: prompts[{i}] has {row.shape[0]} tokens (cut to max_seq_len={max_seq_len}); "
                f"skip_first_positions={skip} needs at least {skip + 2} (sources and targets are positions "
                f"{skip}..seq_len - 2)"
            )
    total = torch.zeros(len(sources), model.cfg.d_model, model.cfg.d_model, dtype=torch.float32)
    with _frozen(model):
        for row in ids:
            total += _prompt_jacobians(model, row, sources, skip, dim_batch)
    return JacobianLens(model, total / len(ids), sources, len(ids))


def _source_layers(source_layers: Sequence[int] | None, n: int, caller: str) -> list[int]:
    if source_layers is None:
        return list(range(n - 1))
    if isinstance(source_layers, (str, bytes)) or not isinstance(source_layers, Sequence):
        raise TypeError(f"{caller}: source_layers must be a list of layer indices, got {type(source_layers).__name__}")
    if not source_layers:
        raise ValueError(f"{caller}: source_layers is empty; pass None for every layer but the last")
    layers = set()
    for layer in source_layers:
        index = check_int(layer, "source_layers", caller)
        resolved = index + n if -n <= index < 0 else index
        if not 0 <= resolved < n - 1:
            raise ValueError(
                f"{caller}: source_layers has {layer!r}: source layers are 0..{n - 2} (negative counts from the "
                f"end); the last layer, {n - 1}, is the target (its lens is the identity)"
            )
        layers.add(resolved)
    return sorted(layers)
