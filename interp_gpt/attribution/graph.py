"""`AttributionGraph`: an attribution graph with circuit-tracer's fields and node order, so code written
for circuit-tracer's `Graph` reads ours.

Nodes, in order (the adjacency's rows are targets, its columns sources):

    active features     one per (layer, pos, feature) with a non-zero activation, by layer, pos, feature
    error nodes         one per (layer, pos): hook_mlp_out minus the transcoders' reconstruction there
    token embeddings    one per position: W_E[token] (positions are not nodes)
    logit targets       by descending probability (or as given)

`adjacency_matrix[target, source]` is the direct linear effect of the source node on the target node in
the local replacement model (attention patterns and LayerNorm scales frozen, MLPs replaced by the
transcoders, error nodes added back). See `interp_gpt.attribution` for how it is computed.

Example:
    >>> graph.n_features, graph.n_pos, graph.adjacency_matrix.shape
    >>> graph.logit_token_ids, graph.logit_probabilities
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["AttributionGraph", "LogitTarget"]


class LogitTarget(NamedTuple):
    """One logit target: its label and its vocabulary index (circuit-tracer's `LogitTarget`). A custom
    direction has a virtual index >= the vocabulary size."""

    token_str: str
    vocab_idx: int


@dataclass
class AttributionGraph:
    """An attribution graph (circuit-tracer's `Graph` fields; see the module's docs for the node order).

    Attributes:
        input_string: the prompt as given (its text; "" for token ids).
        input_tokens: `[n_pos]` the token ids attributed.
        logit_targets: one `LogitTarget` per logit node, in node order.
        logit_probabilities: `[n_logits]` their probabilities (or weights, for custom targets).
        active_features: `[n_active, 3]` (layer, pos, feature) of every non-zero feature.
        activation_values: `[n_active]` their activations.
        selected_features: `[n_selected]` indices into active_features of the feature nodes in the graph.
        adjacency_matrix: `[n_nodes, n_nodes]` direct effects, `[target, source]`: dense, or a
            `torch.sparse_csr_tensor` holding the non-zeros (`attribute(..., sparse=...)`); pruning, the
            graph JSON and the page take either.
        cfg: the model's config (`interp_gpt.Config`).
        scan: an identifier of the transcoders used (circuit-tracer's field), or None.
        vocab_size: the model's vocabulary size.
    """

    input_string: str
    input_tokens: Tensor
    logit_targets: list[LogitTarget]
    logit_probabilities: Tensor
    active_features: Tensor
    activation_values: Tensor
    selected_features: Tensor
    adjacency_matrix: Tensor
    cfg: Any
    scan: str | list[str] | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.vocab_size is None:
            self.vocab_size = int(self.cfg.d_vocab)

    @property
    def n_pos(self) -> int:
        """The number of token positions in the prompt."""
        return int(self.input_tokens.shape[0])

    @property
    def n_features(self) -> int:
        """The feature nodes in the graph (the selected active features)."""
        return int(self.selected_features.shape[0])

    @property
    def n_errors(self) -> int:
        """The error nodes: one per layer and position."""
        return int(self.cfg.n_layers) * self.n_pos

    @property
    def n_logits(self) -> int:
        """The logit nodes (the target tokens attributed from)."""
        return len(self.logit_targets)

    @property
    def logit_token_ids(self) -> Tensor:
        """`[n_logits]` the logit targets' vocabulary indices (circuit-tracer's `logit_token_ids`)."""
        return torch.tensor([t.vocab_idx for t in self.logit_targets], dtype=torch.long)

    def to(self, device: str | torch.device) -> AttributionGraph:
        """The graph's tensors moved to `device`, in place (as circuit-tracer's `Graph.to`)."""
        for name in ("input_tokens", "logit_probabilities", "active_features", "activation_values",
                     "selected_features", "adjacency_matrix"):  # fmt: skip
            setattr(self, name, getattr(self, name).to(device))
        return self
