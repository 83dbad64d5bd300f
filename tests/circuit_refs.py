"""Brute-force references for the circuit tests, written with plain hooks and nothing from
interp_gpt.circuits: sender outputs read at `attn.hook_result` (not `hook_z` as the package does),
and every receiver input rebuilt from scratch as biases + the sum of its senders' outputs.
The input sender is layer 0's `hook_resid_pre`, what the residual stream starts with (not rebuilt
from the embeddings: a shortformer model's starts without the positions). An attention-only
model (`cfg.attn_only`) has no MLP senders, receivers, biases or hooks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from interp_gpt import GPT, Config


def random_model(cfg: Config, seed: int = 0, dtype: torch.dtype = torch.float64) -> GPT:
    """A GPT with seeded random weights, non-zero biases and LayerNorm weights."""
    model = GPT(dataclasses.replace(cfg))  # a config of its own: tests flip its flags
    model.init_weights(seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1].startswith("W_"):
                p.mul_(5.0)  # larger weights: patches then move the logits visibly
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.to(dtype).eval()


@contextmanager
def all_flags(model: GPT):  # type: ignore[no-untyped-def]
    saved = (model.cfg.use_attn_result, model.cfg.use_split_qkv_input, model.cfg.use_hook_mlp_in)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(not model.cfg.attn_only)
    try:
        yield
    finally:
        model.set_use_attn_result(saved[0])
        model.set_use_split_qkv_input(saved[1])
        model.set_use_hook_mlp_in(saved[2])


def layer_senders(cfg: Config, layer: int) -> list[str]:
    """The senders of one layer: its heads, then its MLP unless the model is attention-only."""
    return [f"a{layer}.h{h}" for h in range(cfg.n_heads)] + ([] if cfg.attn_only else [f"m{layer}"])


def sender_names(cfg: Config) -> list[str]:
    return ["input"] + [s for layer in range(cfg.n_layers) for s in layer_senders(cfg, layer)]


def upstream(cfg: Config, layer: int, mlp: bool) -> list[str]:
    """The senders a receiver in `layer` reads (layer = n_layers: the logits)."""
    names = ["input"]
    for ell in range(layer):
        names += layer_senders(cfg, ell)
    if mlp:
        names += [f"a{layer}.h{h}" for h in range(cfg.n_heads)]
    return names


def bias(model: GPT, layer: int, mlp: bool) -> Tensor:
    """The biases in a receiver's input: b_O and b_out of every earlier layer (+ b_O of its own for an MLP)."""
    total = torch.zeros_like(model.blocks[0].attn.b_O)
    for ell in range(layer):
        total = total + model.blocks[ell].attn.b_O
        if not model.cfg.attn_only:
            total = total + model.blocks[ell].mlp.b_out
    if mlp:
        total = total + model.blocks[layer].attn.b_O
    return total


def sender_values(model: GPT, tokens: Tensor) -> dict[str, Tensor]:
    """Every sender's output [batch, pos, d_model] by name, from one hooked run."""
    with all_flags(model), torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    out = {"input": cache["blocks.0.hook_resid_pre"]}
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            out[f"a{layer}.h{h}"] = cache[f"blocks.{layer}.attn.hook_result"][:, :, h]
        if not model.cfg.attn_only:
            out[f"m{layer}"] = cache[f"blocks.{layer}.hook_mlp_out"] - model.blocks[layer].mlp.b_out
    return out


def parse(edge: str) -> tuple[str, str]:
    s, r = edge.split("->")
    return s.strip(), r.strip()


def brute_patch(model: GPT, clean: Tensor, other: dict[str, Tensor], edges: list[str]) -> Tensor:
    """Logits of the clean run where each receiver input is rebuilt as its biases plus, per sender,
    the other value for a patched edge and this run's output for any other edge."""
    cfg, n = model.cfg, model.cfg.n_layers
    patched = {parse(e) for e in edges}
    live: dict[str, Tensor] = {}

    def rebuild(receiver: str, layer: int, mlp: bool) -> Tensor:
        total = bias(model, layer, mlp)
        for s in upstream(cfg, layer, mlp):
            total = total + (other[s] if (s, receiver) in patched else live[s])
        return total

    def start(x: Tensor, hook: Any) -> None:  # no receiver comes before it: the clean input
        live["input"] = x

    hooks: list[tuple[str, Callable[..., Any]]] = [("blocks.0.hook_resid_pre", start)]
    for layer in range(n):

        def result(x: Tensor, hook: Any, layer: int = layer) -> None:
            for h in range(cfg.n_heads):
                live[f"a{layer}.h{h}"] = x[:, :, h]

        def mlp_out(x: Tensor, hook: Any, layer: int = layer) -> None:
            live[f"m{layer}"] = x - model.blocks[layer].mlp.b_out

        def mlp_in(x: Tensor, hook: Any, layer: int = layer) -> Tensor:
            return rebuild(f"m{layer}", layer, True)

        hooks.append((f"blocks.{layer}.attn.hook_result", result))
        if not cfg.attn_only:
            hooks += [(f"blocks.{layer}.hook_mlp_out", mlp_out), (f"blocks.{layer}.hook_mlp_in", mlp_in)]
        for c in "qkv":

            def qkv(x: Tensor, hook: Any, layer: int = layer, c: str = c) -> Tensor:
                new = x.clone()
                for h in range(cfg.n_heads):
                    new[:, :, h] = rebuild(f"a{layer}.h{h}<{c}>", layer, False)
                return new

            hooks.append((f"blocks.{layer}.hook_{c}_input", qkv))

    def final(x: Tensor, hook: Any) -> Tensor:
        return rebuild("logits", n, False)

    hooks.append((f"blocks.{n - 1}.hook_resid_post", final))
    with all_flags(model), torch.no_grad():
        return model.run_with_hooks(clean, fwd_hooks=hooks)


def receiver_inputs_and_grads(model: GPT, resid0: Tensor, metric: Callable[[Tensor], Tensor]) -> dict[str, Tensor]:
    """d metric / d (each receiver's input) [batch, pos, d_model], by receiver name, by autograd on
    a run from the residual stream `resid0` (the input embeddings)."""
    cfg, n = model.cfg, model.cfg.n_layers
    kept: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[..., Tensor]:
        def fn(x: Tensor, hook: Any) -> Tensor:
            y = x.clone()
            kept[name] = y
            return y

        return fn

    hooks = [(f"blocks.{layer}.hook_{c}_input", keep(f"{layer}{c}")) for layer in range(n) for c in "qkv"]
    if not cfg.attn_only:
        hooks += [(f"blocks.{layer}.hook_mlp_in", keep(f"m{layer}")) for layer in range(n)]
    hooks.append((f"blocks.{n - 1}.hook_resid_post", keep("logits")))
    with all_flags(model), torch.enable_grad():
        x = resid0.detach().clone().requires_grad_(True)
        logits = model.run_with_hooks(x, start_at_layer=0, fwd_hooks=hooks)
        names = list(kept)
        # allow_unused: under backward rules that hold the attention pattern constant, q and k reach nothing.
        wrt = [kept[k] for k in names]
        grads = dict(zip(names, torch.autograd.grad(metric(logits), wrt, allow_unused=True, materialize_grads=True), strict=True))  # fmt: skip
    out = {}
    for layer in range(n):
        for c in "qkv":
            for h in range(cfg.n_heads):
                out[f"a{layer}.h{h}<{c}>"] = grads[f"{layer}{c}"][:, :, h]
        if not cfg.attn_only:
            out[f"m{layer}"] = grads[f"m{layer}"]
    out["logits"] = grads["logits"]
    return out


def diff_times_grad(
    edge_names: list[str], clean: dict[str, Tensor], other: dict[str, Tensor], grads: dict[str, Tensor]
) -> Tensor:
    """Per edge (in `edge_names`' order): sum over batch and positions of (other - clean) sender output
    times its receiver input's gradient (EAP's score, given the gradients)."""
    out = torch.empty(len(edge_names), dtype=torch.float64)
    for i, name in enumerate(edge_names):
        s, r = parse(name)
        out[i] = ((other[s] - clean[s]) * grads[r]).sum()
    return out


def resid_pre_grads(
    model: Any, tokens: Tensor, hooks: list[tuple[str, Any]], metric: Callable[[Tensor], Tensor]
) -> list[Tensor]:
    """d metric / d every layer's `hook_resid_pre`, with `hooks` (name, fn) attached: any model with
    transformer-lens' `run_with_hooks` (ours, a HookedTransformer). A layer the metric does not reach gets zeros."""
    kept: list[Tensor] = []

    def keep(x: Tensor, hook: Any) -> Tensor:
        kept.append(x)
        return x

    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(model.cfg.n_layers)]
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks + [(n, keep) for n in names])
        return list(torch.autograd.grad(metric(logits), kept, allow_unused=True, materialize_grads=True))
