"""Random attribution graphs for the pruning tests, and a float64 brute-force influence reference.

A random graph has circuit-tracer's node order (features, errors, embeddings, logits) and only edges an
attribution graph can have: a feature at (layer, pos) reads features and errors of earlier layers and
embeddings at positions <= pos; the logits read every feature, error and embedding; errors and
embeddings read nothing. So it has no cycle."""

from __future__ import annotations

import torch
from torch import Tensor

from interp_gpt import Config
from interp_gpt.attribution import AttributionGraph, LogitTarget


def random_graph(
    seed: int,
    *,
    signed: bool = True,
    density: float = 0.5,
    dtype: torch.dtype = torch.float32,
    zero_errors: bool = False,
    min_feature: int = 0,
) -> AttributionGraph:
    """A random graph: 1-3 layers, 1-4 positions, 0-12 active features (some not selected), 1-4 logits.
    Every selected feature reads its own position's embedding (so it has an input) and the last
    position's embedding reaches every logit. `zero_errors`: error nodes have no outgoing edge.
    `min_feature`: feature indices start there (>= n_layers avoids circuit-tracer's id collision)."""
    g = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=g))

    n_layers, n_pos, n_logits, d_vocab = randint(1, 3), randint(1, 4), randint(1, 4), 50
    n_active = randint(0, 12)
    rows = sorted({(randint(0, n_layers - 1), randint(0, n_pos - 1), randint(min_feature, min_feature + 20))
                   for _ in range(n_active)})  # fmt: skip
    active = torch.tensor(rows, dtype=torch.long).reshape(-1, 3)
    n_active = active.shape[0]
    keep = torch.rand(n_active, generator=g) < 0.8
    selected = torch.nonzero(keep).flatten()
    feats = active[selected]
    n_f, n_e = selected.shape[0], n_layers * n_pos
    e0, t0, l0 = n_f, n_f + n_e, n_f + n_e + n_pos
    n = l0 + n_logits

    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i, (layer, pos, _) in enumerate(feats.tolist()):
        allowed[i, :n_f] = (feats[:, 0] < layer) & (feats[:, 1] <= pos)
        for el in range(layer):
            allowed[i, e0 + el * n_pos : e0 + el * n_pos + pos + 1] = True
        allowed[i, t0 : t0 + pos + 1] = True
    allowed[l0:, :l0] = True
    if zero_errors:
        allowed[:, e0:t0] = False
    weights = torch.randn(n, n, generator=g, dtype=torch.float64)
    if not signed:
        weights = weights.abs()
    adj = weights * allowed * (torch.rand(n, n, generator=g, dtype=torch.float64) < density)
    for i, (_, pos, _) in enumerate(feats.tolist()):  # every feature has an input: its embedding
        adj[i, t0 + pos] = 1.0 + torch.rand((), generator=g, dtype=torch.float64)
    adj[l0:, t0 + n_pos - 1] = 1.0 + torch.rand(n_logits, generator=g, dtype=torch.float64)

    probs = torch.rand(n_logits, generator=g, dtype=torch.float64)
    probs = (probs / probs.sum() * 0.9).sort(descending=True).values
    vocab = torch.randperm(d_vocab, generator=g)[:n_logits].tolist()
    return AttributionGraph(
        input_string="",
        input_tokens=torch.randint(0, d_vocab, (n_pos,), generator=g),
        logit_targets=[LogitTarget(f"tok{v}", v) for v in vocab],
        logit_probabilities=probs.to(dtype),
        active_features=active,
        activation_values=torch.rand(n_active, generator=g).to(dtype) + 0.1,
        selected_features=selected,
        adjacency_matrix=adj.to(dtype),
        cfg=Config(n_layers=n_layers, d_model=8, n_heads=2, d_vocab=d_vocab, n_ctx=8),
        scan="random",
    )


def influence64(adj: Tensor, logit_weights: Tensor) -> Tensor:
    """`w ((I - A)^-1 - I)` in float64 for the row-normalised |A|: every node's total influence."""
    a = adj.double().abs()
    a = a / a.sum(1, keepdim=True).clamp(min=1e-10)
    eye = torch.eye(a.shape[0], dtype=torch.float64)
    return logit_weights.double() @ (torch.linalg.inv(eye - a) - eye)


def logit_weights(graph: AttributionGraph) -> Tensor:
    w = torch.zeros(graph.adjacency_matrix.shape[0], dtype=torch.float64)
    w[-graph.n_logits :] = graph.logit_probabilities.double()
    return w
