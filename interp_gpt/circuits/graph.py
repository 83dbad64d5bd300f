"""The model's computational graph as circuit-finding tools count it (auto-circuit, the EAP-IG code).

Senders (nodes that write to the residual stream), in forward order:
    input, a0.h0 ... a0.h{H-1}, m0, a1.h0 ..., m{L-1}
Receiver inputs (what reads the residual stream), in forward order:
    a{L}.h{h}<q>, a{L}.h{h}<k>, a{L}.h{h}<v> for each head of layer L, then m{L}; last `logits`
An edge is a sender -> a receiver input, for every sender upstream of it: a head of layer L
reads the input and layers < L; MLP L also reads layer L's heads; the logits read every sender.
GPT-2 small has 32,491 edges. An attention-only model (`cfg.attn_only`) has no `m{L}` nodes:
each layer then has `n_heads` senders and `3 * n_heads` receiver inputs (`mlps_per_layer` = 0).

Edges are numbered receiver by receiver (forward order), and within a receiver by sender (forward
order). The senders a receiver reads are always a prefix of the sender list, so edge
`offset[receiver] + sender` is the index: score tensors of edge methods are `[n_edges]` in this
order, and `graph.to_matrix(scores)` lays one out as `[n_senders, n_receivers]`.

What an edge carries (see patch.py): a receiver's input is its residual-stream input *before*
its LayerNorm; a head sender's output is `z[:, :, h] @ W_O[h]` (no `b_O`), an MLP's is its
output minus `b_out`, the input's is what the residual stream starts with: `embed + pos_embed`,
or `embed` alone with shortformer positions (`positional_embedding_type="shortformer"`: those are
added to each layer's queries and keys after ln1, and belong to no sender). Biases belong to no sender.

Example:
    >>> g = Graph(preset("gpt2"))
    >>> g.n_edges
    32491
    >>> g.edge_index("a0.h1 -> a1.h0<k>")
    ...
    >>> g.edge_name(0)
    'input -> a0.h0<q>'
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..config import Config

__all__ = ["Graph", "Receiver"]

QKV = ("q", "k", "v")
_EDGE_RE = re.compile(r"^\s*(\S+?)\s*->\s*(\S+?)\s*$")
_EXPECTED = "expected edge names, edge indices (ints or an integer tensor) or a bool mask [n_edges]"
_np_bool = np.bool_


@dataclass(frozen=True)
class Receiver:
    """One receiver input: `kind` is "q", "k", "v" (a head's input; `head` set), "mlp" or "logits".
    `layer` is n_layers for the logits."""

    layer: int
    kind: str
    head: int | None = None

    @property
    def name(self) -> str:
        """The node's name as the graph prints it, e.g. `a1.h0<q>`, `m0` or `logits`."""
        if self.kind in QKV:
            return f"a{self.layer}.h{self.head}<{self.kind}>"
        return "logits" if self.kind == "logits" else f"m{self.layer}"


class Graph:
    """Nodes and edges of a GPT-2-shaped model (see the module's docs for the names and order).

    Build it from a `Config` (no weights needed) or a model: `Graph(cfg)`, `Graph.from_model(model)`.

    Example:
        >>> g = Graph.from_model(model)
        >>> g.n_nodes, g.n_edges
        >>> g.edge_name(g.edge_index("m0 -> logits"))
        'm0 -> logits'
    """

    def __init__(self, cfg: Config):
        if not isinstance(cfg, Config):
            raise TypeError(f"Graph: cfg must be an interp_gpt Config, got {type(cfg).__name__}")
        self.cfg = cfg
        n, h = cfg.n_layers, cfg.n_heads
        self.n_layers, self.n_heads = n, h
        self.mlps_per_layer: int = 0 if cfg.attn_only else 1  # an attention-only model has no MLP nodes
        senders = ["input"]
        for layer in range(n):
            senders += [f"a{layer}.h{i}" for i in range(h)] + [f"m{layer}"] * self.mlps_per_layer
        self.senders: list[str] = senders
        receivers: list[Receiver] = []
        for layer in range(n):
            receivers += [Receiver(layer, c, i) for i in range(h) for c in QKV]
            receivers += [Receiver(layer, "mlp")] * self.mlps_per_layer
        receivers.append(Receiver(n, "logits"))
        self.receivers: list[Receiver] = receivers
        self.receiver_names: list[str] = [r.name for r in receivers]
        self._sender_index = {s: i for i, s in enumerate(senders)}
        self._receiver_index = {r: i for i, r in enumerate(self.receiver_names)}
        # How many senders (a prefix of `senders`) each receiver reads, and where its edges start.
        n_up = [self.n_upstream(r) for r in receivers]
        offsets = [0]
        for k in n_up:
            offsets.append(offsets[-1] + k)
        self.receiver_n_senders: list[int] = n_up
        self.receiver_offsets: list[int] = offsets[:-1]
        self.n_edges: int = offsets[-1]
        self.nodes: list[str] = senders + ["logits"]
        self.n_nodes: int = len(self.nodes)
        self._edge_sender: Tensor | None = None
        self._edge_receiver: Tensor | None = None

    @classmethod
    def from_model(cls, model: Any) -> Graph:
        """The graph of `model` (anything with a GPT-2 `cfg`)."""
        cfg = getattr(model, "cfg", None)
        if not isinstance(cfg, Config):
            raise TypeError(f"Graph.from_model: model must be an interp_gpt GPT, got {type(model).__name__}")
        return cls(cfg)

    def __repr__(self) -> str:
        return (
            f"Graph(n_layers={self.n_layers}, n_heads={self.n_heads}, n_nodes={self.n_nodes}, n_edges={self.n_edges})"
        )

    # ----- structure ---------------------------------------------------------
    @property
    def _senders_per_layer(self) -> int:
        return self.n_heads + self.mlps_per_layer

    @property
    def _receivers_per_layer(self) -> int:
        return 3 * self.n_heads + self.mlps_per_layer

    def n_upstream(self, receiver: Receiver) -> int:
        """How many senders `receiver` reads (they are the first ones of `senders`)."""
        before = 1 + receiver.layer * self._senders_per_layer
        return before + self.n_heads if receiver.kind == "mlp" else before

    def sender_layer(self, sender: int) -> int:
        """The layer a sender is computed in (-1 for the input)."""
        return -1 if sender == 0 else (sender - 1) // self._senders_per_layer

    def sender_head(self, sender: int) -> int | None:
        """The head of a head sender, None for the input and the MLPs."""
        if sender == 0:
            return None
        i = (sender - 1) % self._senders_per_layer
        return None if i == self.n_heads else i

    def head_sender(self, layer: int, head: int) -> int:
        """The sender index of head `head` of layer `layer`."""
        return 1 + layer * self._senders_per_layer + head

    def mlp_sender(self, layer: int) -> int:
        """The sender index of layer `layer`'s MLP (ValueError on an attention-only model)."""
        self._need_mlps(f"mlp_sender({layer})")
        return 1 + layer * self._senders_per_layer + self.n_heads

    def head_receiver(self, layer: int, head: int, kind: str) -> int:
        """The receiver index of the q, k or v input (`kind`) of head `head` of layer `layer`."""
        return layer * self._receivers_per_layer + 3 * head + QKV.index(kind)

    def mlp_receiver(self, layer: int) -> int:
        """The receiver index of layer `layer`'s MLP input (ValueError on an attention-only model)."""
        self._need_mlps(f"mlp_receiver({layer})")
        return layer * self._receivers_per_layer + 3 * self.n_heads

    def _need_mlps(self, what: str) -> None:
        if not self.mlps_per_layer:
            raise ValueError(f"{what}: the model is attention-only (attn_only=True), it has no MLP nodes")

    @property
    def logits_receiver(self) -> int:
        """The receiver index of the logits (the last receiver)."""
        return len(self.receivers) - 1

    @property
    def receiver_node(self) -> Tensor:
        """`[n_receivers]`: the node (index into `nodes`) each receiver input belongs to; the logits are the last."""
        out = []
        for r in self.receivers:
            if r.kind == "logits":
                out.append(self.n_nodes - 1)
            elif r.kind == "mlp":
                out.append(self.mlp_sender(r.layer))
            else:
                out.append(self.head_sender(r.layer, int(r.head or 0)))
        return torch.tensor(out, dtype=torch.long)

    @property
    def edge_sender(self) -> Tensor:
        """`[n_edges]` sender index of each edge."""
        if self._edge_sender is None:
            self._edge_sender = torch.cat([torch.arange(k) for k in self.receiver_n_senders])
        return self._edge_sender

    @property
    def edge_receiver(self) -> Tensor:
        """`[n_edges]` receiver-input index of each edge."""
        if self._edge_receiver is None:
            counts = torch.tensor(self.receiver_n_senders)
            self._edge_receiver = torch.repeat_interleave(torch.arange(len(self.receivers)), counts)
        return self._edge_receiver

    def edge(self, sender: int, receiver: int) -> int:
        """The index of the edge sender -> receiver (indices into `senders` / `receivers`)."""
        if not 0 <= receiver < len(self.receivers):
            raise ValueError(f"receiver={receiver} is out of range: receiver inputs are 0..{len(self.receivers) - 1}")
        n_up = self.receiver_n_senders[receiver]
        if not 0 <= sender < n_up:
            raise ValueError(
                f"no edge {self._sender_label(sender)} -> {self.receiver_names[receiver]}: "
                f"{self.receiver_names[receiver]} reads {self._reads(receiver)}"
            )
        return self.receiver_offsets[receiver] + sender

    # ----- names -------------------------------------------------------------
    def edge_name(self, index: int) -> str:
        """`'a0.h1 -> a1.h0<k>'` for an edge index."""
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            and not (isinstance(index, Tensor) and index.ndim == 0)
        ):
            raise TypeError(f"edge index must be an int, got {type(index).__name__}")
        i = int(index)
        if not 0 <= i < self.n_edges:
            raise ValueError(f"edge index {i} is out of range: edges are 0..{self.n_edges - 1}")
        return f"{self.senders[int(self.edge_sender[i])]} -> {self.receiver_names[int(self.edge_receiver[i])]}"

    @property
    def edge_names(self) -> list[str]:
        """Every edge's name, in index order."""
        return [
            f"{self.senders[s]} -> {name}"
            for name, k in zip(self.receiver_names, self.receiver_n_senders, strict=True)
            for s in range(k)
        ]

    def sender_index(self, name: str) -> int:
        """The index of a sender node ("input", "a0.h1", "m3")."""
        if not isinstance(name, str):
            raise TypeError(f"sender must be a node name such as 'a0.h1', got {type(name).__name__}")
        name = name.strip()
        if name not in self._sender_index:
            raise KeyError(self._unknown("sender node", name, self.senders))
        return self._sender_index[name]

    def receiver_index(self, name: str) -> int:
        """The index of a receiver input ("a1.h0<k>", "m3", "logits")."""
        if not isinstance(name, str):
            raise TypeError(f"receiver must be a name such as 'a1.h0<q>', got {type(name).__name__}")
        name = name.strip()
        if name not in self._receiver_index:
            m = re.fullmatch(r"a(\d+)\.h(\d+)", name)
            if m and name in self._sender_index:
                opts = ", ".join(f"{name}<{c}>" for c in QKV)
                raise KeyError(f"receiver {name!r}: a head receives through its query, key or value input: {opts}")
            raise KeyError(self._unknown("receiver input", name, self.receiver_names))
        return self._receiver_index[name]

    def node_index(self, name: str) -> int:
        """The index of a node in `nodes` (the senders, then "logits")."""
        if name == "logits":
            return self.n_nodes - 1
        if isinstance(name, str) and name.strip() not in self._sender_index:
            raise KeyError(self._unknown("node", name.strip(), self.nodes))
        return self.sender_index(name)

    def edge_index(self, name: str) -> int:
        """The index of an edge named `'sender -> receiver'` (`'a0.h1 -> a1.h0<k>'`, `'m3 -> logits'`)."""
        if not isinstance(name, str):
            raise TypeError(f"edge must be a name such as 'a0.h1 -> a1.h0<k>', got {type(name).__name__}")
        m = _EDGE_RE.match(name)
        if m is None:
            raise ValueError(
                f"edge {name!r}: expected 'sender -> receiver', e.g. 'a0.h1 -> a1.h0<k>' or 'm3 -> logits'"
            )
        s = self.sender_index(m.group(1))
        r = self.receiver_index(m.group(2))
        return self.edge(s, r)

    def edge_indices(self, edges: Any, *, arg: str = "edges", caller: str = "Graph.edge_indices") -> Tensor:
        """Edge indices `[k]`, ascending as given, from one of: edge names (`'a0.h1 -> a1.h0<k>'`),
        edge indices (ints or an integer tensor `[k]`), or a bool mask `[n_edges]` (a tensor, a
        numpy array or a list of bools). One name or one index is a set of one edge.

        Refused (by `arg`, with `caller` in the message): an integer tensor or list of `n_edges`
        values that are all 0 or 1 (a mask or indices? pass `.bool()` for a mask), any uint8 / int8
        tensor (torch's old mask dtype), a float tensor, indices out of range, an edge given twice."""
        where = f"{caller}: {arg}"
        if not isinstance(edges, Tensor) and hasattr(edges, "dtype") and hasattr(edges, "shape"):
            try:  # a numpy array (or anything torch reads as one)
                edges = torch.as_tensor(edges)
            except (TypeError, RuntimeError) as err:
                raise TypeError(f"{where}: an array of {edges.dtype} is not edges; {_EXPECTED}") from err
        if isinstance(edges, Tensor):
            if edges.dtype == torch.bool:
                if edges.shape != (self.n_edges,):
                    raise ValueError(
                        f"{where}: a bool mask of shape {tuple(edges.shape)}; a mask has one value per edge, "
                        f"[{self.n_edges}] (n_edges)"
                    )
                return edges.nonzero().flatten().cpu()
            if edges.is_floating_point() or edges.is_complex() or edges.ndim > 1:
                raise TypeError(f"{where}: a {edges.dtype} tensor of shape {tuple(edges.shape)}; {_EXPECTED}")
            if edges.dtype in (torch.uint8, torch.int8):
                raise TypeError(
                    f"{where}: a {edges.dtype} tensor is ambiguous (torch once read uint8 as a mask); "
                    f"pass .bool() for a mask of {self.n_edges} edges or .long() for edge indices"
                )
            values = edges.flatten().cpu().long().tolist()
            kind = f"{edges.dtype} tensor"
        else:
            if isinstance(edges, (str, int)) and not isinstance(edges, bool):
                edges = [edges]
            if isinstance(edges, (bytes, bool)) or not isinstance(edges, Iterable):
                raise TypeError(f"{where}: got {type(edges).__name__}; {_EXPECTED}")
            items = list(edges)
            if items and all(isinstance(e, (bool, _np_bool)) for e in items):
                if len(items) != self.n_edges:
                    raise ValueError(
                        f"{where}: a list of {len(items)} bools is not a mask: a mask has one value per edge, "
                        f"{self.n_edges} (n_edges)"
                    )
                return torch.tensor([bool(e) for e in items]).nonzero().flatten()
            values = []
            kind = "list"
            for item in items:
                if isinstance(item, str):
                    try:
                        values.append(self.edge_index(item))
                    except KeyError as err:
                        raise KeyError(f"{where}: {err.args[0]}") from None
                    except ValueError as err:
                        raise ValueError(f"{where}: {err}") from None
                    kind = "list of names"
                elif not isinstance(item, (bool, _np_bool)) and hasattr(item, "__index__"):  # int, numpy int
                    try:
                        values.append(operator.index(item))
                    except TypeError as err:
                        raise TypeError(f"{where}: {item!r} is not an edge name or index; {_EXPECTED}") from err
                else:
                    raise TypeError(f"{where}: {item!r} is not an edge name or index; {_EXPECTED}")
        n = len(values)
        if n == self.n_edges and kind != "list of names" and set(values) <= {0, 1}:
            raise TypeError(
                f"{where}: a {kind} of {n} values, all 0 or 1, is ambiguous (a mask of {n} edges, or indices?); "
                "pass a bool mask (.bool(), or a list of True/False) or a list of distinct edge indices"
            )
        bad = [i for i in values if not 0 <= i < self.n_edges]
        if bad:
            raise ValueError(f"{where}: edge index {bad[0]} is out of range: edges are 0..{self.n_edges - 1}")
        seen: set[int] = set()
        for i in values:
            if i in seen:
                raise ValueError(
                    f"{where}: edge {i} ({self.edge_name(i)!r}) is given twice; give each edge once "
                    "(a set of edges has no repeats)"
                )
            seen.add(i)
        return torch.tensor(values, dtype=torch.long)

    def edge_mask(self, edges: Any, *, arg: str = "edges", caller: str = "Graph.edge_mask") -> Tensor:
        """A boolean mask `[n_edges]` with the given edges set (anything `edge_indices` takes)."""
        mask = torch.zeros(self.n_edges, dtype=torch.bool)
        mask[self.edge_indices(edges, arg=arg, caller=caller)] = True
        return mask

    # ----- layouts -----------------------------------------------------------
    def to_matrix(self, scores: Tensor, fill: float = float("nan")) -> Tensor:
        """Lay out `[n_edges]` values as `[n_senders, n_receivers]` (`fill` where there is no edge)."""
        if not isinstance(scores, Tensor) or scores.shape[-1:] != (self.n_edges,):
            got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise ValueError(f"scores: expected a tensor [..., {self.n_edges}] (one value per edge), got {got}")
        out = scores.new_full((*scores.shape[:-1], len(self.senders), len(self.receivers)), fill)
        out[..., self.edge_sender.to(scores.device), self.edge_receiver.to(scores.device)] = scores
        return out

    def node_scores(self, scores: Tensor) -> Tensor:
        """`[..., n_senders]` node scores from edge scores `[..., n_edges]`: each sender's edges summed.
        For a score that is `(corrupted - clean output) . gradient at the receiver` (EAP, EAP-IG, GIM,
        RelP) this is the sender's own attribution, since its output reaches every receiver it feeds.

        Example:
            >>> g.node_scores(eap_scores(model, clean, corrupted, metric))   # [len(g.senders)]
        """
        if not isinstance(scores, Tensor) or scores.shape[-1:] != (self.n_edges,):
            got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise ValueError(f"scores: expected a tensor [..., {self.n_edges}] (one value per edge), got {got}")
        out = scores.new_zeros((*scores.shape[:-1], len(self.senders)))
        return out.index_add_(-1, self.edge_sender.to(scores.device), scores)

    def top_edges(self, scores: Tensor, k: int = 10, absolute: bool = True) -> list[tuple[str, float]]:
        """The `k` edges with the largest scores (by magnitude with `absolute`), as (name, score)."""
        if not isinstance(scores, Tensor) or scores.shape != (self.n_edges,):
            raise ValueError(f"scores: expected a tensor [{self.n_edges}], got {getattr(scores, 'shape', scores)!r}")
        key = scores.abs() if absolute else scores
        order = key.argsort(descending=True)[:k]
        return [(self.edge_name(int(i)), float(scores[i])) for i in order]

    # ----- errors ------------------------------------------------------------
    def _sender_label(self, sender: int) -> str:
        return self.senders[sender] if 0 <= sender < len(self.senders) else f"sender {sender}"

    def _reads(self, receiver: int) -> str:
        n_up = self.receiver_n_senders[receiver]
        last = self.senders[n_up - 1]
        return "only the input" if n_up == 1 else f"the senders input .. {last} (layers before it)"

    def _unknown(self, what: str, name: str, known: Sequence[str]) -> str:
        if not self.mlps_per_layer and re.fullmatch(r"m\d+", name):
            return f"unknown {what} {name!r}: the model is attention-only (attn_only=True), it has no MLP nodes"
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)  # names are short: "mo" -> "m0"
        msg = f"unknown {what} {name!r}"
        if close:
            return msg + f"; did you mean {' or '.join(repr(c) for c in close)}?"
        return msg + f"; names look like {known[:3]} ... {known[-1]!r}"
