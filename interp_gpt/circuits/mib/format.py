"""MIB's graph files, both ways: the EAP-IG code's JSON and `.pt` forms, the nine-circuit form, and a
submission folder laid out as MIB's README asks.

The EAP-IG code (on which MIB's circuit track is built) names the same nodes and edges as `Graph`:
nodes `input`, `a{L}.h{H}`, `m{L}`, `logits`; edges `'a0.h1->a1.h0<k>'` (ours print `'a0.h1 -> a1.h0<k>'`).
Its matrices are `[n_forward, n_backward]`: senders in our order, receivers per layer as every head's
q input, then every head's k, then every v, then the MLP (ours: q, k, v of head 0, then head 1, ...),
the logits last. `cfg` holds `n_layers`, `n_heads`, `parallel_attn_mlp` (false for GPT-2) and `d_model`.

Example:
    >>> scores = eap_ig_scores(model, clean, corrupted, metric)
    >>> save_mib_graph("ioi_gpt2/importances.json", model, scores)
    >>> load_mib_graph("ioi_gpt2/importances.json", model).edge_scores   # [n_edges], our order
"""

from __future__ import annotations

import difflib
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...config import Config
from ...files import atomic_folder, write_atomic
from ..circuit import Circuit
from ..graph import QKV, Graph

__all__ = [
    "MIB_PERCENTAGES",
    "MIB_TASKS",
    "MIB_MODELS",
    "MIBGraph",
    "mib_receivers",
    "mib_edge_name",
    "save_mib_graph",
    "load_mib_graph",
    "save_mib_circuits",
    "write_mib_submission",
    "check_mib_submission",
]

# The fractions of the scored items (edges or nodes) MIB keeps, in order (evaluation.py).
MIB_PERCENTAGES: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# The folders MIB's leaderboard reads ({task}_{model}, MIB_circuit_track/utils.py's COL_MAPPING).
MIB_TASKS = ("ioi", "mcqa", "arithmetic-addition", "arithmetic-subtraction", "arc-easy", "arc-challenge")
MIB_MODELS = ("gpt2", "qwen2.5", "gemma2", "llama3", "interpbench")
_SUFFIXES = (".json", ".pt")


def _graph_of(model_or_graph: Any, caller: str) -> Graph:
    if isinstance(model_or_graph, Graph):
        graph = model_or_graph
    elif isinstance(model_or_graph, Config):
        graph = Graph(model_or_graph)
    elif isinstance(getattr(model_or_graph, "cfg", None), Config):
        graph = Graph(model_or_graph.cfg)
    else:
        raise TypeError(
            f"{caller}: model must be an interp_gpt GPT, its Config or a circuits Graph, got {type(model_or_graph).__name__}"
        )
    if not graph.mlps_per_layer:
        raise ValueError(
            f"{caller}: the model is attention-only (attn_only=True); MIB's graph has an MLP in every layer"
        )
    return graph


def mib_receivers(graph: Graph) -> Tensor:
    """`[n_receivers]`: for each column of MIB's `[n_forward, n_backward]` matrices, our receiver index."""
    order = []
    for layer in range(graph.n_layers):
        order += [graph.head_receiver(layer, h, c) for c in QKV for h in range(graph.n_heads)]
        order.append(graph.mlp_receiver(layer))
    order.append(graph.logits_receiver)
    return torch.tensor(order, dtype=torch.long)


def mib_edge_name(name: str) -> str:
    """MIB's spelling of an edge name: `'a0.h1 -> a1.h0<k>'` -> `'a0.h1->a1.h0<k>'`."""
    return re.sub(r"\s*->\s*", "->", name.strip())


def _mib_cfg(graph: Graph) -> dict[str, Any]:
    return {
        "n_layers": graph.n_layers,
        "n_heads": graph.n_heads,
        "parallel_attn_mlp": False,
        "d_model": graph.cfg.d_model,
    }


def _columns(graph: Graph) -> Tensor:
    """`[n_edges]`: each of our edges' column in MIB's matrices."""
    col_of = torch.empty(len(graph.receivers), dtype=torch.long)
    col_of[mib_receivers(graph)] = torch.arange(len(graph.receivers))
    return col_of[graph.edge_receiver]


@dataclass
class MIBGraph:
    """A graph file read into our graph's order: `edge_scores [n_edges]` (None in a circuit file without
    scores), `in_graph [n_edges]` (the circuit the file holds), `node_scores [n_senders]` (NaN: not scored;
    None: no node scores) and `nodes_in_graph [n_senders]` (the senders, `graph.senders`)."""

    graph: Graph
    edge_scores: Tensor | None
    in_graph: Tensor
    node_scores: Tensor | None
    nodes_in_graph: Tensor

    @property
    def circuit(self) -> Circuit:
        """The file's circuit (its `in_graph` edges) as a `Circuit`."""
        return Circuit(self.graph, self.in_graph, self.edge_scores)


def _vector(values: Any, n: int, arg: str, what: str, caller: str, dtype: torch.dtype | None = None) -> Tensor:
    if not isinstance(values, Tensor) or values.shape != (n,):
        got = f"shape {tuple(values.shape)}" if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"{caller}: {arg} must be a tensor [{n}] ({what}), got {got}")
    if dtype == torch.bool and values.dtype != torch.bool:
        raise TypeError(f"{caller}: {arg} must be a bool tensor [{n}] ({what}), got {values.dtype}")
    if dtype is None and not values.is_floating_point():
        raise TypeError(f"{caller}: {arg} must be a float tensor [{n}] ({what}), got {values.dtype}")
    return values.detach().cpu()


def save_mib_graph(
    path: str | Path,
    model: Any,
    edge_scores: Tensor | None = None,
    *,
    circuit: Any = None,
    node_scores: Tensor | None = None,
) -> Path:
    """Write a graph in MIB's format (`.json` or `.pt` by the suffix), whole or not at all.

    Args:
        model: the GPT (or its Config, or a `Graph`) the scores belong to.
        edge_scores: `[n_edges]` in our graph's order (EAP, EAP-IG, ...); 0 where None.
        circuit: the edges in the circuit (a `Circuit`, names, indices or a bool mask): MIB's `in_graph`,
            pruned as MIB prunes; none by default (an importance-score file).
        node_scores: `[n_senders]` node scores (`Graph.node_scores`), for MIB's node level.

    Example:
        >>> task = induction_task(model, n=4)
        >>> scores = circuits.eap_scores(model, task.clean, task.corrupted, task.metric)
        >>> save_mib_graph("ioi_gpt2/importances.pt", model, scores).name
        'importances.pt'
    """
    caller = "save_mib_graph"
    graph = _graph_of(model, caller)
    path = Path(path)
    if path.suffix not in _SUFFIXES:
        raise ValueError(f"{caller}: path {str(path)!r} must end in .json or .pt (MIB's two forms)")
    scores = (
        torch.zeros(graph.n_edges)
        if edge_scores is None
        else _vector(edge_scores, graph.n_edges, "edge_scores", "one per edge", caller).float()
    )
    if circuit is None:
        in_graph = torch.zeros(graph.n_edges, dtype=torch.bool)
    else:
        mask = circuit.mask if isinstance(circuit, Circuit) else graph.edge_mask(circuit, arg="circuit", caller=caller)
        in_graph = Circuit(graph, mask).pruned().mask
    nodes = _nodes_in_graph(graph, in_graph)
    nscores = None
    if node_scores is not None:
        nscores = _vector(node_scores, len(graph.senders), "node_scores", "one per sender", caller).float()
    if path.suffix == ".json":
        write_atomic(path, json.dumps(_to_json(graph, scores, in_graph, nodes, nscores)))
    else:
        buf = io.BytesIO()
        torch.save(_to_pt(graph, scores, in_graph, nodes, nscores), buf)
        write_atomic(path, buf.getvalue())
    return path


def _nodes_in_graph(graph: Graph, in_graph: Tensor) -> Tensor:
    """`[n_senders]`: senders with a kept edge out (after pruning, each also has one in)."""
    nodes = torch.zeros(len(graph.senders), dtype=torch.bool)
    nodes[graph.edge_sender[in_graph]] = True
    return nodes


def _to_json(graph: Graph, scores: Tensor, in_graph: Tensor, nodes: Tensor, nscores: Tensor | None) -> dict[str, Any]:
    node_dict: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(graph.senders):
        node_dict[name] = {"in_graph": bool(nodes[i])}
        if nscores is not None:
            node_dict[name]["score"] = float(nscores[i])
    node_dict["logits"] = {"in_graph": True}
    names = graph.edge_names
    edges = {
        mib_edge_name(n): {"score": float(s), "in_graph": bool(k)}
        for n, s, k in zip(names, scores.tolist(), in_graph.tolist(), strict=True)
    }
    return {"cfg": _mib_cfg(graph), "nodes": node_dict, "edges": edges}


def _to_pt(graph: Graph, scores: Tensor, in_graph: Tensor, nodes: Tensor, nscores: Tensor | None) -> dict[str, Any]:
    cols = _columns(graph)
    shape = (len(graph.senders), len(graph.receivers))
    matrix = torch.zeros(shape)
    matrix[graph.edge_sender, cols] = scores
    kept = torch.zeros(shape, dtype=torch.bool)
    kept[graph.edge_sender, cols] = in_graph
    dst = [graph.receiver_names[int(r)] for r in mib_receivers(graph)]
    out: dict[str, Any] = {
        "cfg": _mib_cfg(graph),
        "src_nodes": list(graph.senders),
        "dst_nodes": dst,
        "edges_scores": matrix,
        "edges_in_graph": kept,
        "nodes_in_graph": nodes.clone(),
    }
    if nscores is not None:
        out["nodes_scores"] = nscores.clone()
    return out


# ----------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------
def load_mib_graph(path: str | Path, model: Any) -> MIBGraph:
    """Read a graph in MIB's format (`.json` or `.pt`, as the EAP-IG code's `to_json` / `to_pt` write
    them) into `model`'s graph order. Refused, by name: a file for a model of another shape
    (`cfg`), an edge or node our graph lacks, an edge missing from a JSON file, a non-finite score.

    Example:
        >>> task = induction_task(model, n=4)
        >>> path = save_mib_graph("ioi_gpt2/importances.json", model, circuits.eap_scores(model, task.clean, task.corrupted, task.metric))
        >>> graph = load_mib_graph(path, model)
        >>> graph.edge_scores.shape, graph.in_graph.any()
        (torch.Size([110]), tensor(False))
        >>> result = mib_score(model, task, graph, progress=False)      # CPR and CMD of its scores
    """
    caller = "load_mib_graph"
    graph = _graph_of(model, caller)
    path = Path(path)
    if path.suffix not in _SUFFIXES:
        raise ValueError(f"{caller}: {str(path)!r} is not a MIB graph file: expected a .json or .pt file")
    if not path.is_file():
        raise FileNotFoundError(f"{caller}: no file {str(path)!r}")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{caller}: {str(path)!r} is not JSON ({err})") from None
        return _from_json(graph, data, str(path), caller)
    data = torch.load(path, map_location="cpu", weights_only=True)
    return _from_pt(graph, data, str(path), caller)


def _check_keys(data: Any, keys: Sequence[str], where: str, caller: str) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{caller}: {where} holds a {type(data).__name__}, expected a dict with keys {list(keys)}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(
            f"{caller}: {where} lacks {missing} (MIB's graph files hold {list(keys)}; it has {sorted(data)})"
        )


def _check_cfg(graph: Graph, cfg: Any, where: str, caller: str) -> None:
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{caller}: {where}: cfg must be a dict, got {type(cfg).__name__}")
    want = _mib_cfg(graph)
    for key in ("n_layers", "n_heads", "d_model"):
        if key in cfg and cfg[key] != want[key]:
            raise ValueError(
                f"{caller}: {where} is a graph of another model: its cfg has {key}={cfg[key]!r}, "
                f"the model's is {want[key]!r} ({want})"
            )
        if key == "n_layers" or key == "n_heads":
            if key not in cfg:
                raise ValueError(f"{caller}: {where}: cfg lacks {key!r} (it has {sorted(cfg)})")
    if cfg.get("parallel_attn_mlp"):
        raise ValueError(f"{caller}: {where} is a graph of a model with parallel attention and MLP; GPT-2's are not")


def _unknown(kind: str, name: str, known: list[str], where: str, caller: str) -> KeyError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return KeyError(f"{caller}: {where} names {kind} {name!r}, which the model's graph does not have{hint}")


def _from_json(graph: Graph, data: Any, where: str, caller: str) -> MIBGraph:
    _check_keys(data, ("cfg", "nodes", "edges"), where, caller)
    _check_cfg(graph, data["cfg"], where, caller)
    index = {mib_edge_name(n): i for i, n in enumerate(graph.edge_names)}
    scores = torch.full((graph.n_edges,), float("nan"))
    in_graph = torch.zeros(graph.n_edges, dtype=torch.bool)
    seen = torch.zeros(graph.n_edges, dtype=torch.bool)
    edges = data["edges"]
    if not isinstance(edges, Mapping):
        raise ValueError(f"{caller}: {where}: 'edges' must map edge names to {{'score', 'in_graph'}}")
    for name, info in edges.items():
        i = index.get(mib_edge_name(str(name)))
        if i is None:
            raise _unknown("edge", str(name), list(index), where, caller)
        if not isinstance(info, Mapping) or "in_graph" not in info:
            raise ValueError(f"{caller}: {where}: edge {name!r} must hold 'in_graph' (and 'score'), got {info!r}")
        if "score" in info:
            scores[i] = _finite(info["score"], f"edge {name!r}'s score", where, caller)
        in_graph[i] = bool(info["in_graph"])
        seen[i] = True
    if not bool(seen.all()):
        missing = [graph.edge_names[int(i)] for i in (~seen).nonzero().flatten()[:3]]
        raise ValueError(
            f"{caller}: {where} lists {int(seen.sum())} of the graph's {graph.n_edges} edges; missing e.g. "
            f"{[mib_edge_name(m) for m in missing]}: a MIB graph file lists every edge"
        )
    any_score = bool((~scores.isnan()).any())
    nodes = data["nodes"]
    if not isinstance(nodes, Mapping):
        raise ValueError(f"{caller}: {where}: 'nodes' must map node names to {{'in_graph', 'score'}}")
    senders = {s: i for i, s in enumerate(graph.senders)}
    node_in = torch.zeros(len(graph.senders), dtype=torch.bool)
    nscores = torch.full((len(graph.senders),), float("nan"))
    any_node_score = False
    for name, info in nodes.items():
        if name == "logits":
            continue
        i = senders.get(str(name))
        if i is None:
            raise _unknown("node", str(name), list(senders), where, caller)
        if not isinstance(info, Mapping):
            raise ValueError(f"{caller}: {where}: node {name!r} must hold 'in_graph' (and 'score'), got {info!r}")
        node_in[i] = bool(info.get("in_graph", False))
        if "score" in info:
            any_node_score = True
            nscores[i] = float(info["score"])
    return MIBGraph(graph, scores if any_score else None, in_graph, nscores if any_node_score else None, node_in)


def _finite(value: Any, what: str, where: str, caller: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{caller}: {where}: {what} is {value!r}; expected a finite number")
    return float(value)


def _from_pt(graph: Graph, data: Any, where: str, caller: str) -> MIBGraph:
    keys = ("cfg", "src_nodes", "dst_nodes", "edges_scores", "edges_in_graph", "nodes_in_graph")
    _check_keys(data, keys, where, caller)
    _check_cfg(graph, data["cfg"], where, caller)
    dst = [graph.receiver_names[int(r)] for r in mib_receivers(graph)]
    for key, want in (("src_nodes", list(graph.senders)), ("dst_nodes", dst)):
        got = list(data[key])
        if got != want:
            extra = [n for n in got if n not in want]
            if extra:
                raise _unknown("node", str(extra[0]), want, where, caller)
            raise ValueError(f"{caller}: {where}: {key} is not the model's ({len(got)} names, expected {len(want)})")
    shape = (len(graph.senders), len(graph.receivers))
    for key in ("edges_scores", "edges_in_graph"):
        t = data[key]
        if not isinstance(t, Tensor) or tuple(t.shape) != shape:
            found = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"{caller}: {where}: {key} has shape {found}, expected {list(shape)} [n_forward, n_backward]"
            )
    cols = _columns(graph)
    scores = data["edges_scores"].float()[graph.edge_sender, cols]
    if not bool(scores.isfinite().all()):
        bad = int((~scores.isfinite()).nonzero()[0])
        raise ValueError(f"{caller}: {where}: edge {mib_edge_name(graph.edge_name(bad))!r}'s score is not finite")
    in_graph = data["edges_in_graph"].bool()[graph.edge_sender, cols]
    nodes = data["nodes_in_graph"]
    if not isinstance(nodes, Tensor) or tuple(nodes.shape) != (len(graph.senders),):
        raise ValueError(f"{caller}: {where}: nodes_in_graph must be [{len(graph.senders)}] (one per sender node)")
    nscores = data.get("nodes_scores")
    if nscores is not None:
        if not isinstance(nscores, Tensor) or tuple(nscores.shape) != (len(graph.senders),):
            raise ValueError(f"{caller}: {where}: nodes_scores must be [{len(graph.senders)}] (one per sender node)")
        nscores = nscores.float().clone()
    return MIBGraph(graph, scores, in_graph, nscores, nodes.bool().clone())


# ----------------------------------------------------------------------------
# the nine-circuit form and the submission folder
# ----------------------------------------------------------------------------
def _circuit_file(pct: float, suffix: str) -> str:
    return f"circuit_{pct:g}{suffix}"


def save_mib_circuits(
    folder: str | Path, model: Any, edge_scores: Tensor, *, absolute: bool = True, suffix: str = ".json"
) -> list[Path]:
    """Write MIB's nine-circuit form: one circuit per edge percentage 0.1% ... 50% (MIB_PERCENTAGES
    but 100%), each the top `int(pct * n_edges)` edges by score (by magnitude with `absolute`), pruned
    as MIB prunes, with no scores, files `circuit_0.001.json` ... `circuit_0.5.json`. The folder is
    written whole or not at all.

    Example:
        >>> task = induction_task(model, n=4)
        >>> paths = save_mib_circuits("ioi_gpt2", model, circuits.eap_scores(model, task.clean, task.corrupted, task.metric))
        >>> [p.name for p in paths][:3]
        ['circuit_0.001.json', 'circuit_0.002.json', 'circuit_0.005.json']
    """
    caller = "save_mib_circuits"
    graph = _graph_of(model, caller)
    scores = _vector(edge_scores, graph.n_edges, "edge_scores", "one per edge", caller).float()
    if suffix not in _SUFFIXES:
        raise ValueError(f"{caller}: suffix={suffix!r}, expected '.json' or '.pt'")
    paths = []
    folder = Path(folder)
    with atomic_folder(folder) as tmp:
        for pct in MIB_PERCENTAGES[:-1]:
            circuit = Circuit.top_k(graph, scores, int(pct * graph.n_edges), absolute=absolute)
            save_mib_graph(tmp / _circuit_file(pct, suffix), graph, None, circuit=circuit)
            paths.append(folder / _circuit_file(pct, suffix))
    return paths


def write_mib_submission(root: str | Path, entries: Mapping[str, Any], *, suffix: str = ".json") -> Path:
    """A submission folder as MIB's README asks: one folder `{task}_{model}` per entry (e.g. `ioi_gpt2`)
    holding `importances.json` (or `.pt`), written whole or not at all. `entries` maps the folder name
    to `(model, edge_scores)` or `(model, edge_scores, node_scores)`. Run `check_mib_submission` on
    the result before uploading.

    Example:
        >>> task = induction_task(model, n=4)
        >>> scores = circuits.eap_scores(model, task.clean, task.corrupted, task.metric)
        >>> write_mib_submission("eap_submission", {"ioi_gpt2": (model, scores), "mcqa_gpt2": (model, scores)}).name
        'eap_submission'
    """
    caller = "write_mib_submission"
    if not isinstance(entries, Mapping) or not entries:
        raise TypeError(f"{caller}: entries must be a non-empty dict {{'ioi_gpt2': (model, edge_scores)}}")
    for name in entries:
        problem = _folder_problem(str(name))
        if problem:
            raise ValueError(f"{caller}: entries: {problem}")
    root = Path(root)
    with atomic_folder(root) as tmp:
        for name, entry in entries.items():
            if not isinstance(entry, tuple) or len(entry) not in (2, 3):
                raise TypeError(f"{caller}: entries[{name!r}] must be (model, edge_scores[, node_scores])")
            model, scores = entry[0], entry[1]
            nodes = entry[2] if len(entry) == 3 else None
            save_mib_graph(tmp / str(name) / f"importances{suffix}", model, scores, node_scores=nodes)
    return root


def _folder_problem(name: str) -> str | None:
    task, _, model = name.rpartition("_")
    if not task or task not in MIB_TASKS or model not in MIB_MODELS:
        return (
            f"folder {name!r} is not '{{task}}_{{model}}' with a MIB task {list(MIB_TASKS)} and model "
            f"{list(MIB_MODELS)} (e.g. 'ioi_gpt2')"
        )
    return None


def check_mib_submission(root: str | Path, model: Any = None) -> list[str]:
    """What a MIB submission folder lacks, as sentences (an empty list: nothing found missing). Checks the
    folder names (`{task}_{model}`), that each holds one importance file or nine circuits (no more than
    0.1% ... 50% of the edges), that each file reads as a MIB graph (of `model`'s shape, where given,
    for the `_gpt2` folders), and MIB's rule of at least two models and two tasks.

    Example:
        >>> task = induction_task(model, n=4)
        >>> scores = circuits.eap_scores(model, task.clean, task.corrupted, task.metric)
        >>> root = write_mib_submission("eap_submission", {"ioi_gpt2": (model, scores), "mcqa_gpt2": (model, scores)})
        >>> check_mib_submission(root, model)
        ['MIB asks for circuits of at least 2 models; the folder has 1 (gpt2)']
    """
    root = Path(root)
    if not root.is_dir():
        return [f"{str(root)!r} is not a folder"]
    problems: list[str] = []
    tasks, models = set(), set()
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        return [f"{str(root)!r} holds no '{{task}}_{{model}}' folders (e.g. 'ioi_gpt2')"]
    for folder in folders:
        problem = _folder_problem(folder.name)
        if problem:
            problems.append(problem)
            continue
        task, _, model_name = folder.name.rpartition("_")
        files = sorted(p for p in folder.iterdir() if p.suffix in _SUFFIXES)
        if len(files) == 1:
            kind = "importances"
        elif len(files) == 9:
            kind = "circuits"
        else:
            problems.append(
                f"{folder.name}: holds {len(files)} .json/.pt files; expected one importance-score file or nine "
                "circuits (0.1% ... 50% of the edges)"
            )
            continue
        tasks.add(task)
        models.add(model_name)
        if model is None or model_name != "gpt2":
            continue
        loaded = []
        for f in files:
            try:
                loaded.append(load_mib_graph(f, model))
            except (ValueError, KeyError) as err:
                problems.append(f"{folder.name}/{f.name}: {err}")
        if kind == "circuits" and len(loaded) == 9:
            sizes = sorted(int(g.in_graph.sum()) for g in loaded)
            n = loaded[0].graph.n_edges
            for pct, size in zip(MIB_PERCENTAGES[:-1], sizes, strict=True):
                if size > pct * n:
                    problems.append(
                        f"{folder.name}: the circuits, smallest first, should keep at most {pct:.1%} of the {n} "
                        f"edges each; one keeps {size} ({size / n:.2%})"
                    )
                    break
        if kind == "importances" and loaded and loaded[0].edge_scores is None and loaded[0].node_scores is None:
            problems.append(
                f"{folder.name}/{files[0].name}: holds no scores (an importance file scores edges or nodes)"
            )
    if len(models) < 2:
        problems.append(
            f"MIB asks for circuits of at least 2 models; the folder has {len(models)} ({', '.join(sorted(models))})"
        )
    if len(tasks) < 2:
        problems.append(
            f"MIB asks for circuits of at least 2 tasks; the folder has {len(tasks)} ({', '.join(sorted(tasks))})"
        )
    return problems
