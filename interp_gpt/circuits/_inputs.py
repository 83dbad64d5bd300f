"""The checks every circuit entry point shares, run once where its inputs enter (then one clean run).
The model and the prompts come in through the one way in the analysis packages share
(`interp_gpt.prepare`); what is the circuits' own is checked here.

- The model: an interp_gpt GPT with no SAE spliced in that would change what the edge graph
  reads (`circuit_model`).
- Prompts: clean and corrupted (or the ablation's reference) line up row by row and position by
  position. Strings are tokenized (right-padded, as `model.to_tokens`) and each row's real length
  is known: a clean row and its corrupted row must have the same number of tokens, or the call is
  refused naming the row and both lengths, since edge patching would otherwise patch a pad
  position's values into a real one. Token tensors are taken as given: every position is a real
  token. The "mean" and "resample" ablations mix the reference's rows position by position, so
  its rows (the clean ones by default) must all be of one length.
- Edge sets (`edge_sets_of`): names, indices or masks, as `Graph.edge_indices` takes them.
- Caches (the direct-path sweeps): each holds the hooks needed, for the tokens' batch and positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..checks import check_int_in_range, check_shape
from ..model.gpt import GPT
from ..prepare import Prompts, checked_model, prompts
from ._run import BaseRun, Metric, SenderValues, base_run, run_edge_sets
from .graph import Graph

__all__ = ["ABLATIONS", "circuit_model", "check_rows_align", "Prepared", "prepare", "edge_sets_of", "check_z_cache"]

ABLATIONS = ("zero", "mean", "resample")


# ----------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------
def circuit_model(model: Any, caller: str, gradient: bool = False) -> GPT:
    """`model`, checked (the one way in, `interp_gpt.prepare.checked_model`): a GPT whose spliced SAEs
    (if any) leave the edge graph exact. An SAE without the error term replaces the activation after the
    senders are read there (so edges carry values the model no longer uses); with `gradient` (EAP), any
    SAE, since gradients pass through its reconstruction only, even with the error term."""
    if gradient:
        return checked_model(model, caller, splices="none", why=_GRADIENT_WHY)
    return checked_model(model, caller, splices="error_term", why=_ERROR_TERM_WHY)


_GRADIENT_WHY = (
    "gradients pass through its reconstruction only (with or without the error term), so edge attribution "
    "would not be the model's gradient: take it out with model.reset_saes() (exact edge patching, "
    "patch_edges / exact_edge_scores, is exact with an SAE spliced with use_error_term=True)"
)
_ERROR_TERM_WHY = (
    "it replaces that activation after the edge graph reads its senders, so edge patches would be wrong: "
    "splice it with model.add_sae(sae, use_error_term=True), or take it out with model.reset_saes()"
)


# ----------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------
def check_rows_align(clean: Prompts, other: Prompts, arg: str, caller: str) -> None:
    """Refuse `other` unless each of its rows has the clean row's shape of real tokens."""
    n_clean, n_other = clean.ids.shape[0], other.ids.shape[0]
    if n_clean != n_other:
        raise ValueError(
            f"{caller}: {arg} has {n_other} prompt(s) but clean_tokens has {n_clean}: "
            "edge patching pairs each clean prompt with one corrupted prompt"
        )
    if clean.lengths is not None or other.lengths is not None:
        for row in range(n_clean):
            a, b = clean.length(row), other.length(row)
            if a != b:
                raise ValueError(
                    f"{caller}: row {row}: clean_tokens has {a} tokens but {arg} has {b}; edge patching lines "
                    "a clean prompt and its corrupted prompt up position by position, so a padded position "
                    "would be patched into a real one: give pairs that tokenize to the same length "
                    "(model.to_str_tokens shows the tokens)"
                )
    check_shape(other.ids, clean.ids.shape, arg, "clean_tokens' [batch, pos]", caller=caller)


def _check_one_length(p: Prompts, arg: str, ablation: str, caller: str) -> None:
    if p.lengths is None:
        return
    for row, n in enumerate(p.lengths):
        if n != p.lengths[0]:
            raise ValueError(
                f"{caller}: {arg} row {row} has {n} tokens but row 0 has {p.lengths[0]}; the {ablation!r} "
                "ablation mixes the prompts position by position, so a padded position would stand in for "
                "a real one: give prompts that tokenize to one length"
            )


class Prepared(NamedTuple):
    """What `prepare` returns: the checked model, its graph, the clean run, the other value of
    every sender (a `SenderValues`) and the other run's sender outputs as one tensor."""

    model: GPT
    graph: Graph
    base: BaseRun
    other_of: SenderValues
    other: Tensor

    def run(self, sets: list[Tensor], metric: Metric | None, **kw: Any) -> Tensor:
        """`run_edge_sets` on these inputs: each edge set's patched run of the clean input, the
        patched edges taking the other values (`kw`: its keyword options)."""
        return run_edge_sets(
            self.model, self.graph, self.base, self.other_of, self.base.sender_values, sets, metric, **kw
        )

    def run_circuits(self, masks: Sequence[Tensor], metric: Metric, **kw: Any) -> Tensor:
        """Metric `[len(masks)]` of the circuits `masks` (bool `[n_edges]` each: those edges keep their
        clean values, every other edge is patched); equal masks are run once (`kw`: `run`'s options)."""
        keys = [bytes(m.numpy().tobytes()) for m in masks]
        by_key = dict(zip(keys, masks, strict=True))  # equal masks share a key: one run each
        values = self.run([(~m).nonzero().flatten() for m in by_key.values()], metric, **kw)
        where = {k: i for i, k in enumerate(by_key)}
        return torch.stack([values[where[k]] for k in keys]).cpu()


def prepare(
    model: Any,
    clean: Any,
    corrupted: Any,
    reference: Any = None,
    seed: int = 0,
    caller: str = "patch_edges",
    gradient: bool = False,
) -> Prepared:
    """Check the inputs; run the clean input once. Returns the model, its graph, the clean run,
    the other value of every sender (`[batch or 1, pos, k, d_model]` for sender indices `[k]`) and
    the other run's sender outputs as one tensor `[batch or 1, pos, n_senders, d_model]`.
    `gradient`: the caller differentiates the model (EAP)."""
    model = circuit_model(model, caller, gradient)
    graph = Graph(model.cfg)
    clean_p = prompts(model, clean, "clean_tokens", caller)
    other: Tensor
    if isinstance(corrupted, str) and corrupted in ABLATIONS:
        ref_p = clean_p
        if reference is not None:
            ref_p = prompts(model, reference, "reference", caller)
            if ref_p.ids.shape[1] != clean_p.ids.shape[1]:
                raise ValueError(
                    f"{caller}: reference has {ref_p.ids.shape[1]} positions but clean_tokens has "
                    f"{clean_p.ids.shape[1]}: the ablation values are per position"
                )
        arg = "clean_tokens (the reference by default)" if reference is None else "reference"
        if corrupted != "zero":
            _check_one_length(ref_p, arg, corrupted, caller)
        if corrupted == "resample":
            seed = check_int_in_range(seed, "seed", 0, None, caller=caller)
            n = ref_p.ids.shape[0]
            if n < 2:
                raise ValueError(
                    f"{caller}: resample ablation needs at least 2 prompts to draw from, got a batch of {n}"
                )
            if n != clean_p.ids.shape[0]:
                raise ValueError(
                    f"{caller}: reference has {n} prompts but clean_tokens has {clean_p.ids.shape[0]}: the "
                    "'resample' ablation gives each clean prompt another reference prompt's outputs, so "
                    "the batches must be of one size"
                )
        base = base_run(model, clean_p.ids)
        ref = base if reference is None else base_run(model, ref_p.ids)
        if corrupted == "zero":
            other = torch.zeros_like(base.senders[:1])
        elif corrupted == "mean":
            other = ref.senders.mean(dim=0, keepdim=True)
        else:
            n = ref.senders.shape[0]
            gen = torch.Generator().manual_seed(seed)
            # A permutation with no fixed point: every prompt takes another prompt's outputs.
            perm = torch.randperm(n, generator=gen)
            while bool((perm == torch.arange(n)).any()):
                perm = torch.randperm(n, generator=gen)
            other = ref.senders[perm.to(ref.senders.device)]
    elif corrupted is None:
        raise ValueError(f"{caller}: corrupted_tokens is None: pass corrupted tokens or an ablation {ABLATIONS}")
    else:
        if reference is not None:
            raise ValueError(f"{caller}: reference= is for the 'mean' and 'resample' ablations, not corrupted tokens")
        other_p = prompts(model, corrupted, "corrupted_tokens", caller)
        check_rows_align(clean_p, other_p, "corrupted_tokens", caller)
        base = base_run(model, clean_p.ids)
        other = base_run(model, other_p.ids).senders

    def other_of(ps: Tensor) -> Tensor:
        return other[:, :, ps]

    return Prepared(model, graph, base, other_of, other)


# ----------------------------------------------------------------------------
# edge sets
# ----------------------------------------------------------------------------
def edge_sets_of(graph: Graph, edge_sets: Any, caller: str = "patch_edges") -> list[Tensor]:
    """Edge index tensors from a sequence of edge sets (each anything `Graph.edge_indices` takes:
    names, indices, one name, one index, a bool mask) or a bool tensor `[n_sets, n_edges]`."""
    if isinstance(edge_sets, Tensor):
        if edge_sets.dtype != torch.bool or edge_sets.ndim != 2 or edge_sets.shape[1] != graph.n_edges:
            raise ValueError(
                f"{caller}: edge_sets: a tensor must be a bool mask [n_sets, {graph.n_edges}] (n_edges), "
                f"got {edge_sets.dtype} of shape {tuple(edge_sets.shape)}"
            )
        return [row.nonzero().flatten().cpu() for row in edge_sets]
    if isinstance(edge_sets, (str, int)) or not isinstance(edge_sets, Sequence):
        raise TypeError(
            f"{caller}: edge_sets must be a sequence of edge sets (e.g. [['a0.h1 -> a1.h0<k>'], ['m0 -> logits']]) "
            f"or a bool tensor [n_sets, n_edges], got {type(edge_sets).__name__}; wrap a single set in a list"
        )
    return [graph.edge_indices(s, arg=f"edge_sets[{i}]", caller=caller).sort().values for i, s in enumerate(edge_sets)]


# ----------------------------------------------------------------------------
# caches
# ----------------------------------------------------------------------------
def check_z_cache(model: GPT, cache: Any, arg: str, layers: list[int], tokens: Tensor, caller: str) -> None:
    """Refuse a cache that lacks `hook_z` of `layers`, or holds it for another batch or length
    than `tokens` (the corrupted tokens the sweep runs)."""
    if not isinstance(cache, Mapping):
        raise TypeError(
            f"{caller}: {arg} must be an ActivationCache (or a dict of hook name -> tensor), got {type(cache).__name__}"
        )
    cfg = model.cfg
    want = (*tokens.shape, cfg.n_heads, cfg.d_head)
    for layer in layers:
        name = f"blocks.{layer}.attn.hook_z"
        if name not in cache:
            raise KeyError(
                f"{caller}: {arg} holds no {name!r}; run model.run_with_cache on the prompts without "
                "names_filter, or with one that keeps every layer's attn.hook_z"
            )
        z = cache[name]
        if not isinstance(z, Tensor) or tuple(z.shape) != want:
            got = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
            raise ValueError(
                f"{caller}: {arg}[{name!r}] has shape {got} but corrupted_tokens is {list(tokens.shape)}: "
                f"expected {list(want)} [batch, pos, n_heads, d_head], a cache of a batch of the same size and length"
            )
