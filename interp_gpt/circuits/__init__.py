"""Circuits: the model's edge graph, exact edge and path patching, edge scores (EAP, EAP-IG, RelP, GIM,
AtP*), and circuits as the MIB benchmark scores them (`circuits.mib`).

The graph (`graph.py`) has the nodes circuit-finding tools count (the input, every head, every
MLP, the logits) and an edge from each sender to each downstream receiver input (a head's q, k or
v input, an MLP, the logits): 32,491 edges for GPT-2 small. An attention-only model
(`attn_only=True`, the classic 2-layer induction setting) has no MLP nodes; with shortformer
positions the input sender is the token embedding alone. Edge methods return `[n_edges]`
tensors in the graph's edge order, so scores, masks and circuits line up.

Every entry point checks its inputs once, with one rule each (`_inputs.py` on the model and prompt
steps every analysis package shares, `interp_gpt.prepare`; `Graph.edge_indices`):
edges are names, indices or a bool mask (an integer 0/1 mask, a float tensor, an index out of range
or given twice is refused); prompts given as text are refused when a clean row and its corrupted
row tokenize to different lengths (token tensors are taken as given: every position real); an
SAE spliced without its error term is refused (any SAE for EAP / EAP-IG, whose gradients would
pass through its reconstruction); EAP / EAP-IG refuse a metric whose gradient is zero everywhere.

The modules, by job: `graph.py` (nodes, edges, names), `_inputs.py` (the checks every entry point
shares, edge sets, the clean run), `_run.py` (the batched edge-patched forward on the model's own hook
points, `run_edge_sets`), `patch.py` (`patch_edges`, `path_patch`, transformer-lens 4.3's
`get_act_patch_direct_path*`), `scores.py` (`eap_scores`, `eap_ig_scores`, `exact_edge_scores`), `rules.py` and
`estimators.py` (EAP with a modified backward: `relp_scores`, `gim_scores`), `atp_star.py` (`atp_star_scores`:
AtP*, EAP with the exact softmax for queries and keys and GradDrop), `circuit.py` (`Circuit`: top-k,
threshold, `acdc`, pruning; `faithfulness`, `faithfulness_curve`); the `mib` subpackage (MIB's files,
CPR / CMD, tasks).

Example:
    >>> from interp_gpt.circuits import Graph, eap_scores, patch_edges
    >>> g = Graph.from_model(model)
    >>> scores = eap_scores(model, clean_tokens, corrupted_tokens, metric)      # [g.n_edges]
    >>> g.top_edges(scores, k=5)
    >>> patch_edges(model, clean_tokens, corrupted_tokens, [["a0.h1 -> a1.h0<k>"]], metric)
"""

from __future__ import annotations

from .atp_star import atp_star_layer_scores, atp_star_scores
from .circuit import Circuit, FaithfulnessCurve, acdc, faithfulness, faithfulness_curve
from .estimators import gim_scores, relp_scores
from .graph import Graph, Receiver
from .patch import (
    ABLATIONS,
    get_act_patch_direct_path,
    get_act_patch_direct_path_all_sources,
    patch_edges,
    path_patch,
)
from .scores import eap_ig_scores, eap_scores, exact_edge_scores

__all__ = [
    "Graph",
    "Receiver",
    "ABLATIONS",
    "patch_edges",
    "path_patch",
    "get_act_patch_direct_path",
    "get_act_patch_direct_path_all_sources",
    "eap_scores",
    "eap_ig_scores",
    "exact_edge_scores",
    "relp_scores",
    "gim_scores",
    "atp_star_scores",
    "atp_star_layer_scores",
    "Circuit",
    "FaithfulnessCurve",
    "acdc",
    "faithfulness",
    "faithfulness_curve",
]
