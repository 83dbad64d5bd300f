"""MIB's circuit metrics: faithfulness at MIB's edge (or node) percentages, CPR and CMD, and a random-circuit
baseline, with MIB's four interventions. Numbers equal MIB's `evaluate_area_under_curve` (MIB-circuit-track
b759df3 on the EAP-IG code at 7af394a).

At each percentage p of the scored items (every edge; or every node with a score), the circuit is the
`int(p * n)` items with the largest scores (by magnitude with `absolute`), pruned to what connects the
input to the logits (a node-level circuit keeps every edge out of a kept node into a kept node or the
logits). Edges outside the circuit are patched (MIB's `evaluate_graph`), and

    faithfulness = (metric(circuit) - metric(empty circuit)) / (metric(full model) - metric(empty circuit))

CPR is the area under faithfulness and CMD the area under |1 - faithfulness|, both by trapezoids over the
raw percentages (MIB's `log_scale` flag is computed but never used; `log_scale=True` gives the areas
over log(p), labelled as such).

The interventions, as MIB's code computes them (an edge outside the circuit carries `other - output`):
- "patching": other = the sender's output on the counterfactual prompt.
- "zero": other = 0 for MIB's node outputs (`hook_embed` for the input, so the position embeddings stay;
  `hook_mlp_out` with its bias for an MLP; a head's `hook_result`, without `b_O`).
- "mean-positional": other = the sender's output averaged over the reference prompts, per position.
- "mean": as MIB's `compute_mean_activations` returns it: ONE vector for every node, the average over all
  nodes of (each reference prompt's output at its last real token / the prompt's length), averaged over
  prompts. It is not a per-node mean; we match it so that the numbers are MIB's.

Example:
    >>> task = induction_task(model)
    >>> result = mib_score(model, task, eap_ig_scores(model, task.clean, task.corrupted, task.metric))
    >>> result.cpr, result.cmd
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ...checks import check_int_in_range, check_seed, check_type
from ...model.gpt import GPT
from .._inputs import Prepared, circuit_model, prepare
from .._run import base_run, sender_hook_names, sender_outputs
from ..circuit import Circuit
from ..graph import Graph
from .format import MIB_PERCENTAGES, MIBGraph
from .tasks import Task

__all__ = ["MIB_INTERVENTIONS", "MIBScore", "MIBRandomBaseline", "area_under_curve", "mib_score", "mib_random_baseline"]

MIB_INTERVENTIONS = ("patching", "zero", "mean", "mean-positional")
_LEVELS = ("edge", "node")


def area_under_curve(
    percentages: Sequence[float], faithfulness: Sequence[float], log_scale: bool = False
) -> tuple[float, float]:
    """`(CPR, CMD)`: the trapezoid areas under faithfulness and under |1 - faithfulness| over the
    percentages (over their logs with `log_scale`).

    Example:
        >>> cpr, cmd = area_under_curve(MIB_PERCENTAGES, [1.0] * 10)       # a perfect curve
        >>> round(cpr, 6), cmd
        (0.999, 0.0)
    """
    xs = [math.log(p) if log_scale else float(p) for p in percentages]
    fs = [float(f) for f in faithfulness]
    if len(xs) != len(fs) or len(xs) < 2:
        raise ValueError(f"area_under_curve: {len(xs)} percentages and {len(fs)} faithfulness values; give 2+ of each")
    cpr = cmd = 0.0
    for i in range(len(xs) - 1):
        width = xs[i + 1] - xs[i]
        cpr += width * (fs[i] + fs[i + 1]) / 2
        cmd += width * (abs(1 - fs[i]) + abs(1 - fs[i + 1])) / 2
    return cpr, cmd


@dataclass
class MIBScore:
    """One method's MIB numbers: at each of `percentages`, `n_items` items kept (before pruning), the circuit
    MIB runs (`circuits[i]`, a bool mask `[n_edges]`, after its pruning; `n_edges[i]` its edges: MIB's own
    "weighted edge count" is taken before `evaluate_graph` prunes again and, at the node level, counts
    pairs of kept nodes that are no edge), the `metric` and its `faithfulness`; `full` / `empty`: the
    metric with every / no edge kept; `cpr`, `cmd` (areas over the raw percentages, or over their logs
    when `log_scale`) and `average` (the mean faithfulness)."""

    level: str
    intervention: str
    absolute: bool
    percentages: tuple[float, ...]
    n_items: list[int]
    n_edges: list[int]
    metric: Tensor
    faithfulness: Tensor
    full: float
    empty: float
    cpr: float
    cmd: float
    average: float
    log_scale: bool = False
    circuits: list[Tensor] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:
        scale = ", log scale" if self.log_scale else ""
        return (
            f"MIBScore({self.level}, {self.intervention}: CPR {self.cpr:.4f}, CMD {self.cmd:.4f}{scale}, "
            f"faithfulness {[round(float(f), 3) for f in self.faithfulness]})"
        )


@dataclass
class MIBRandomBaseline:
    """Random circuits of MIB's sizes: `samples` (one `MIBScore` per draw) and the mean and standard
    deviation of their CPR, CMD and faithfulness at each percentage."""

    samples: list[MIBScore]
    cpr_mean: float
    cpr_std: float
    cmd_mean: float
    cmd_std: float
    faithfulness_mean: Tensor = field(repr=False)
    faithfulness_std: Tensor = field(repr=False)


# ----------------------------------------------------------------------------
# the interventions
# ----------------------------------------------------------------------------
def _mlp_senders(graph: Graph) -> list[int]:
    return [graph.mlp_sender(layer) for layer in range(graph.n_layers)]


def _b_out(model: GPT) -> Tensor:
    blocks: Any = model.blocks
    return torch.stack([block.mlp.b_out for block in blocks])


def _to_mib_view(model: GPT, graph: Graph, senders: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Our sender outputs as MIB's node outputs, and the position part of our input sender `[batch, pos,
    d_model]`: MIB's input is `hook_embed` alone (ours adds the position embeddings), its MLP outputs keep
    `b_out` (ours do not)."""
    with torch.no_grad():
        pos_part = senders[:, :, 0] - model.embed(tokens)
    out = senders.clone()
    out[:, :, 0] -= pos_part
    out[:, :, _mlp_senders(graph)] += _b_out(model)
    return out, pos_part


def _from_mib_view(model: GPT, graph: Graph, other: Tensor, pos_part: Tensor) -> Tensor:
    """MIB's node values (broadcast over batch and positions) as our senders' other values."""
    other = other.clone()
    other[:, :, 0] += pos_part
    other[:, :, _mlp_senders(graph)] -= _b_out(model)
    return other


def _masked_senders(model: GPT, tokens: Tensor, lengths: Tensor) -> Tensor:
    """Sender outputs `[batch, pos, n_senders, d_model]` of right-padded prompts run as MIB runs them, with
    the attention mask (a pad position takes no position embedding and is no key): "mean-positional"
    averages pad positions in."""
    mask = (torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=sender_hook_names(model.cfg))
    return sender_outputs(model, cache)


def _prepared(model: GPT, task: Task, intervention: str, reference: Task | None, caller: str) -> Prepared:
    if intervention == "patching":
        if reference is not None:
            raise ValueError(f"{caller}: reference= is for the mean interventions; 'patching' uses the task's prompts")
        return prepare(model, task.clean, task.corrupted, caller=caller)
    model = circuit_model(model, caller)
    graph = Graph(model.cfg)
    dev = model.W_E.device
    base = base_run(model, task.clean.to(dev))
    n_batch, n_pos = task.clean.shape
    _, pos_part = _to_mib_view(model, graph, base.senders, base.tokens)
    if intervention == "zero":
        mib = torch.zeros_like(base.senders[:1])
    else:
        ref = task if reference is None else check_type(reference, Task, "reference", "a Task", caller)
        tokens = ref.clean.to(dev)
        if intervention == "mean-positional" and tokens.shape[1] != n_pos:
            raise ValueError(
                f"{caller}: reference prompts have {tokens.shape[1]} positions but the task's have {n_pos}: "
                "'mean-positional' takes one mean per position"
            )
        view, _ = _to_mib_view(model, graph, _masked_senders(model, tokens, ref.lengths.to(dev)), tokens)
        if intervention == "mean-positional":
            mib = view.mean(0, keepdim=True)
        else:
            lengths = ref.lengths.to(dev)
            last = view[torch.arange(len(ref), device=dev), lengths - 1]  # [n, n_senders, d_model]
            per_node = (last / lengths[:, None, None]).sum(0) / len(ref)  # [n_senders, d_model]
            mib = per_node.mean(0)[None, None, None].expand(1, 1, len(graph.senders), -1)
    other = _from_mib_view(model, graph, mib.expand(1, n_pos, -1, -1), pos_part[:1])
    other = other.expand(n_batch, -1, -1, -1) if other.shape[0] != n_batch else other

    def other_of(ps: Tensor) -> Tensor:
        return other[:, :, ps]

    return Prepared(model, graph, base, other_of, other)


# ----------------------------------------------------------------------------
# circuits at MIB's percentages
# ----------------------------------------------------------------------------
class _Pruner:
    """MIB's circuit from top-n items, as the EAP-IG code at 7af394a builds it: its `[n_forward, n_backward]`
    `in_graph` matrix (a node-level circuit sets a kept node's whole row, including pairs that are no edge
    of the model, such as a head's output into its own query), then its `prune`: nodes with an edge out
    and an edge in (the input counts as fed) stay, edges between staying nodes (or into the logits) stay,
    repeated until the nodes do not change, which it checks before dropping edges, so it can stop one
    round early; `evaluate_graph` prunes once more before it runs. A node-level circuit loses nothing to
    pruning: each kept node's row feeds its own inputs. Only the model's edges of the result are run (the
    other pairs are no input of anything)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        n_s, n_r = len(graph.senders), len(graph.receivers)
        rnode = graph.receiver_node
        own = rnode < n_s  # every receiver but the logits belongs to a sender node
        self.owner = torch.zeros(n_s, n_r, dtype=torch.bool)  # sender node -> its own receiver inputs
        self.owner[rnode[own], torch.arange(n_r)[own]] = True
        self.logits = graph.logits_receiver

    def live_nodes(self, matrix: Tensor) -> Tensor:
        """`[n_senders]`: the nodes with an edge out and an edge in (the input counts as fed)."""
        fed = (matrix.any(0)[None, :] & self.owner).any(1)
        fed[0] = True
        return matrix.any(1) & fed

    def prune(self, matrix: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """MIB's `Graph.prune` of `matrix [n_senders, n_receivers]` with its nodes in the graph `[n_senders]`."""
        while True:
            new = self.live_nodes(matrix)
            same = bool((new == nodes).all())
            nodes = new
            alive = (nodes[:, None] & self.owner).any(0)
            alive[self.logits] = True
            matrix = matrix & nodes[:, None] & alive[None, :]
            if same:
                return matrix, nodes

    def evaluated(self, matrix: Tensor, nodes: Tensor) -> Tensor:
        """The model's edges MIB runs: `apply_topn` prunes, then `evaluate_graph` prunes again."""
        matrix, nodes = self.prune(*self.prune(matrix, nodes))
        return matrix[self.graph.edge_sender, self.graph.edge_receiver]

    def edges(self, mask: Tensor) -> Tensor:
        """An edge-level top-n (`mask [n_edges]`), as MIB evaluates it."""
        matrix = torch.zeros(len(self.graph.senders), len(self.graph.receivers), dtype=torch.bool)
        matrix[self.graph.edge_sender[mask], self.graph.edge_receiver[mask]] = True
        return self.evaluated(matrix, self.live_nodes(matrix))  # apply_topn's nodes: prune's own rule

    def nodes(self, keep: Tensor) -> Tensor:
        """A node-level top-n (`keep [n_senders]`): every kept node's whole row, as MIB evaluates it."""
        matrix = keep[:, None].expand(-1, len(self.graph.receivers)).clone()
        return self.evaluated(matrix, keep.clone())


def _edge_circuits(
    graph: Graph, scores: Tensor, percentages: Sequence[float], absolute: bool
) -> list[tuple[int, Tensor]]:
    n, pruner = graph.n_edges, _Pruner(graph)
    return [(int(p * n), pruner.edges(Circuit.top_k(graph, scores, int(p * n), absolute).mask)) for p in percentages]


def _node_circuits(
    graph: Graph, scores: Tensor, percentages: Sequence[float], absolute: bool
) -> list[tuple[int, Tensor]]:
    scored = ~scores.isnan()
    n = int(scored.sum())
    key = scores.abs() if absolute else scores.clone()
    key[~scored] = float("-inf")
    order = key.argsort(descending=True, stable=True)
    pruner = _Pruner(graph)
    out = []
    for p in percentages:
        k = int(p * n)
        keep = ~scored
        keep[order[:k]] = True
        out.append((k, pruner.nodes(keep)))
    return out


def _check_percentages(percentages: Any, caller: str) -> tuple[float, ...]:
    if isinstance(percentages, (str, bytes)) or not isinstance(percentages, Sequence) or len(percentages) < 2:
        raise TypeError(f"{caller}: percentages must be a list of 2+ fractions such as {MIB_PERCENTAGES}")
    out = []
    for p in percentages:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(
                f"{caller}: percentages: {p!r} is out of range: each is a fraction of the scored items in [0, 1] "
                f"(MIB's: {MIB_PERCENTAGES})"
            )
        out.append(float(p))
    if any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise ValueError(f"{caller}: percentages {out} must increase")
    return tuple(out)


def _scores_for(graph: Graph, scores: Any, level: str, caller: str) -> Tensor:
    if isinstance(scores, MIBGraph):
        if scores.graph.n_edges != graph.n_edges or scores.graph.n_layers != graph.n_layers:
            raise ValueError(
                f"{caller}: scores is a graph file of another model ({scores.graph!r}; the model's is {graph!r})"
            )
        if level == "node" and scores.node_scores is not None:
            return scores.node_scores.float()
        if scores.edge_scores is None:
            raise ValueError(f"{caller}: scores: the graph file holds no edge scores (a circuit file?)")
        scores = scores.edge_scores
    n_s = len(graph.senders)
    if (
        not isinstance(scores, Tensor)
        or not scores.is_floating_point()
        or scores.shape not in ((graph.n_edges,), (n_s,))
    ):
        got = f"{scores.dtype} {tuple(scores.shape)}" if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(
            f"{caller}: scores must be edge scores [{graph.n_edges}], node scores [{n_s}] (level='node') or a "
            f"MIBGraph, got {got}"
        )
    s = scores.detach().float().cpu()
    if s.shape == (n_s,):
        if level != "node":
            raise ValueError(f"{caller}: scores are node scores [{n_s}]; pass level='node'")
        return s
    if level == "node":
        return graph.node_scores(s.nan_to_num(0.0))
    if bool(s.isnan().any()):
        raise ValueError(f"{caller}: scores hold NaN at the edge level; every edge needs a score")
    return s


def _check_choice(value: Any, arg: str, choices: Sequence[str], caller: str) -> str:
    if value not in choices:
        raise ValueError(f"{caller}: {arg}={value!r}, expected one of {list(choices)}")
    return str(value)


class _Run:
    """One task's clean run and intervention values; then the metric of any circuits (bool masks)."""

    def __init__(self, model: GPT, task: Task, intervention: str, reference: Task | None, caller: str, **kw: Any):
        self.task = check_type(task, Task, "task", "a Task (read_task, induction_task, name_mover_task)", caller)
        self.prepared = _prepared(model, task, intervention, reference, caller)
        self.graph, self.kw = self.prepared.graph, kw

    def __call__(self, masks: list[Tensor], desc: str) -> Tensor:
        return self.prepared.run_circuits(
            masks, self.task.metric, desc=desc, logit_positions=self.task.positions, **self.kw
        )


def _result(
    values: Tensor, circuits: list[tuple[int, Tensor]], full: float, empty: float, level: str, intervention: str,
    absolute: bool, percentages: tuple[float, ...], log_scale: bool, caller: str,
) -> MIBScore:  # fmt: skip
    if full == empty:
        raise ValueError(
            f"{caller}: faithfulness is undefined: the full model and the empty circuit give the same metric ({full}); "
            "choose a task whose clean and counterfactual prompts the metric separates"
        )
    faith = (values - empty) / (full - empty)
    cpr, cmd = area_under_curve(percentages, faith.tolist(), log_scale)
    return MIBScore(
        level, intervention, absolute, percentages, [k for k, _ in circuits], [int(m.sum()) for _, m in circuits],
        values, faith, full, empty, cpr, cmd, float(faith.mean()), log_scale, [m for _, m in circuits],
    )  # fmt: skip


def mib_score(
    model: GPT,
    task: Task,
    scores: Any,
    *,
    level: str = "edge",
    intervention: str = "patching",
    absolute: bool = True,
    percentages: Sequence[float] = MIB_PERCENTAGES,
    log_scale: bool = False,
    reference: Task | None = None,
    batch_size: int | None = None,
    progress: bool = True,
) -> MIBScore:
    """MIB's faithfulness curve, CPR and CMD of edge or node scores (see the module's docs).

    Args:
        task: the prompts and answers (`read_task`, `induction_task`, `name_mover_task`); the metric is
            MIB's logit difference.
        scores: edge scores `[n_edges]` (EAP, EAP-IG, ...), node scores `[n_senders]` (level="node"), or a
            graph file read with `load_mib_graph`. At the node level, edge scores are summed per sender.
        level: "edge" or "node".
        intervention: "patching", "zero", "mean" or "mean-positional" (MIB's, see the module's docs).
        absolute: rank by magnitude (MIB's default).
        percentages: the fractions of the scored items (MIB's ten by default).
        log_scale: the areas over log(percentage) instead of MIB's raw percentages.
        reference: the prompts the mean interventions average over (default: the task's clean prompts).

    Example:
        >>> task = induction_task(model, n=8)
        >>> s = mib_score(model, task, circuits.eap_scores(model, task.clean, task.corrupted, task.metric), progress=False)
        >>> s.n_items                                   # edges kept at each percentage (tiny-gpt2 has 110)
        [0, 0, 0, 1, 2, 5, 11, 22, 55, 110]
        >>> s.cpr > 0.5 > s.cmd
        True
    """
    caller = "mib_score"
    model = circuit_model(model, caller)
    level = _check_choice(level, "level", _LEVELS, caller)
    intervention = _check_choice(intervention, "intervention", MIB_INTERVENTIONS, caller)
    pcts = _check_percentages(percentages, caller)
    graph = Graph(model.cfg)
    if not graph.mlps_per_layer:
        raise ValueError(
            f"{caller}: the model is attention-only (attn_only=True); MIB's graph has an MLP in every layer"
        )
    s = _scores_for(graph, scores, level, caller)
    if batch_size is not None:
        check_int_in_range(batch_size, "batch_size", 1, None, "circuits per forward", caller=caller)
    run = _Run(model, task, intervention, reference, caller, batch_size=batch_size, progress=progress)
    circuits = (_node_circuits if level == "node" else _edge_circuits)(graph, s, pcts, bool(absolute))
    full, empty = torch.ones(graph.n_edges, dtype=torch.bool), torch.zeros(graph.n_edges, dtype=torch.bool)
    values = run([m for _, m in circuits] + [full, empty], "MIB circuits")
    return _result(
        values[:-2], circuits, float(values[-2]), float(values[-1]), level, intervention, bool(absolute), pcts,
        log_scale, caller,
    )  # fmt: skip


def mib_random_baseline(
    model: GPT,
    task: Task,
    *,
    n_samples: int = 10,
    level: str = "edge",
    intervention: str = "patching",
    percentages: Sequence[float] = MIB_PERCENTAGES,
    log_scale: bool = False,
    reference: Task | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = True,
) -> MIBRandomBaseline:
    """The random-circuit baseline: `n_samples` draws of random scores (so random edges, or nodes, of
    MIB's sizes, pruned the same way), each scored as `mib_score` scores a method; their mean and spread.

    Example:
        >>> task = induction_task(model, n=8)
        >>> base = mib_random_baseline(model, task, n_samples=4, progress=False)
        >>> len(base.samples), base.faithfulness_mean.shape
        (4, torch.Size([10]))
    """
    caller = "mib_random_baseline"
    model = circuit_model(model, caller)
    n_samples = check_int_in_range(n_samples, "n_samples", 1, None, "draws", caller=caller)
    level = _check_choice(level, "level", _LEVELS, caller)
    intervention = _check_choice(intervention, "intervention", MIB_INTERVENTIONS, caller)
    pcts = _check_percentages(percentages, caller)
    gen = torch.Generator().manual_seed(check_seed(seed, caller=caller))
    graph = Graph(model.cfg)
    run = _Run(model, task, intervention, reference, caller, batch_size=batch_size, progress=progress)
    make = _node_circuits if level == "node" else _edge_circuits
    n = len(graph.senders) if level == "node" else graph.n_edges
    draws = [make(graph, torch.rand(n, generator=gen), pcts, True) for _ in range(n_samples)]
    full, empty = torch.ones(graph.n_edges, dtype=torch.bool), torch.zeros(graph.n_edges, dtype=torch.bool)
    values = run([m for d in draws for _, m in d] + [full, empty], "MIB random circuits")
    k = len(pcts)
    samples = [
        _result(values[i * k : (i + 1) * k], d, float(values[-2]), float(values[-1]), level, intervention, True,
                pcts, log_scale, caller)
        for i, d in enumerate(draws)
    ]  # fmt: skip
    cprs = torch.tensor([s.cpr for s in samples])
    cmds = torch.tensor([s.cmd for s in samples])
    faith = torch.stack([s.faithfulness for s in samples])
    spread = n_samples > 1
    return MIBRandomBaseline(
        samples,
        float(cprs.mean()),
        float(cprs.std()) if spread else 0.0,
        float(cmds.mean()),
        float(cmds.std()) if spread else 0.0,
        faith.mean(0),
        faith.std(0) if spread else torch.zeros(k),
    )
