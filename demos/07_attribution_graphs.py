# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Attribution graphs: which features and tokens compute the next token
#
# An attribution graph (circuit-tracer's, after Anthropic's 2025 "Attribution Graphs" paper) explains
# one next-token prediction in a *local replacement model*: every MLP replaced by a transcoder
# (a sparse layer of features), the attention patterns and LayerNorm scales frozen at their values on
# this prompt, and an error node per (layer, position) for what the transcoders miss. What is left is
# linear, so every edge is one number: the direct effect of one node (a feature, an error node or a
# token embedding) on another (a feature or a logit).
#
# 1. a prompt whose next token the induction heads decide;
# 2. its graph: the logit targets, the graph's scores, pruning, and the path from the earlier
#    occurrence of the token to the logit;
# 3. an intervention on a feature on that path, against what the graph's edge says;
# 4. QK attribution: why the induction head looks where it looks (the graph holds attention fixed);
# 5. the graph as circuit-tracer's JSON.

# %%
MODEL_NAME = "tiny-gpt2"  # or "gpt2": then set TRANSCODERS in the next code cell (none ship for gpt2)

# %% [markdown]
# `tiny-gpt2` (2 layers, 4 heads, `d_model` 128) ships with transcoders trained on it: one JumpReLU
# skip transcoder per layer (`shipped_transcoders`, sae-lens format). Every function below also takes
# its cross-layer transcoder, `shipped_clt()`. Its graph differs, though, and the asserts here are
# written for the per-layer transcoders. For `MODEL_NAME = "gpt2"` you supply the
# transcoders: set `TRANSCODERS` to a local folder with one transcoder per layer of GPT-2 small, each
# reading `blocks.L.ln2.hook_normalized` and writing `blocks.L.hook_mlp_out`. That can be a sae-lens
# transcoder folder (or a folder of them), circuit-tracer's transcoder set (`config.yaml` +
# `layer_i.safetensors`; download `hf://` sets first), or your own from
# `interp-gpt train-transcoder --model gpt2`. `load_transcoders` checks them against the model.
# Nothing here downloads transcoders. GPT-2's weights come through the Hugging Face hub, as in the
# other notebooks, and its graph is capped at `MAX_FEATURE_NODES` feature nodes.

# %%
import json
import math

import plotly.graph_objects as go
import torch

from interp_gpt import GPT
from interp_gpt.attribution import (
    QKAttribution,
    attribute,
    compute_graph_scores,
    feature_intervention,
    prune_graph,
    qk_attribution,
    to_json,
)
from interp_gpt.inspect import head_scores
from interp_gpt.sae import load_transcoders
from interp_gpt.sae.training import shipped_transcoders

TRANSCODERS = None  # for "gpt2": a local folder of GPT-2 small transcoders (see above)
MAX_FEATURE_NODES = None if MODEL_NAME == "tiny-gpt2" else 4096  # None: every active feature is a node

model = GPT.from_pretrained(MODEL_NAME)
if MODEL_NAME == "tiny-gpt2":
    transcoders = shipped_transcoders(model)
elif TRANSCODERS is None:
    raise ValueError(f"MODEL_NAME={MODEL_NAME!r}: set TRANSCODERS to a local folder of its transcoders")
else:
    transcoders = load_transcoders(TRANSCODERS, model)
print(f"{model.cfg.n_layers} layers, {model.cfg.n_heads} heads")
print(transcoders[0] if isinstance(transcoders, list) else transcoders)  # per-layer ones: layer 0's

# %% [markdown]
# ## 1 · A prompt the induction heads decide
#
# The second sentence repeats the first. At its last token the model has seen `... seven` once
# before, followed by ` co` (tiny-gpt2's 2048-token vocabulary splits " copper" into ` co` + `pp` +
# `er`). An induction circuit predicts the token that followed the earlier occurrence: a
# previous-token head in layer 0 writes "the token before me was ..." at every position, and an
# induction head in a later layer, at the last position, looks for the position whose previous token
# is the current one and copies what is there. Without the first sentence the model does not predict
# ` co`.

# %%
PROMPT = "The vizier found seven copper kettles. The vizier found seven"
tokens = model.to_tokens(PROMPT)[0]  # BOS first
str_tokens = model.to_str_tokens(tokens)
last = len(tokens) - 1
earlier = max(i for i in range(last) if tokens[i] == tokens[last])  # the last token's earlier occurrence
key_pos = earlier + 1  # the token that followed it there
answer = int(tokens[key_pos])
with torch.no_grad():
    probs = model(tokens[None])[0, -1].softmax(-1)
    alone = model(model.to_tokens(PROMPT[PROMPT.index(". ") + 2 :]))[0, -1].softmax(-1)
print(f"{len(tokens)} tokens: {str_tokens}")
print(
    f"last token {str_tokens[last]!r} (position {last}) also at position {earlier}, followed by {str_tokens[key_pos]!r}"
)
top = probs.topk(3)
for p, t in zip(top.values, top.indices, strict=True):
    print(f"  p = {p:.3f}  {model.to_string(t[None])!r}")
print(f"p({str_tokens[key_pos]!r}) with the first sentence: {probs[answer]:.3f}; without it: {alone[answer]:.4f}")
assert int(probs.argmax()) == answer and alone[answer] < probs[answer] / 10

# %% [markdown]
# Which head does the copying? The induction heads (top induction scores on repeated random tokens)
# attend from the last position to `key_pos`. We take the head that attends there most; section 4 asks
# why it does. The previous-token head (top previous-token score in an earlier layer) comes back there.

# %%
_, cache = model.run_with_cache(tokens[None], names_filter=lambda name: name.endswith("hook_pattern"))
to_key = torch.stack(
    [cache[f"blocks.{layer}.attn.hook_pattern"][0, :, last, key_pos] for layer in range(model.cfg.n_layers)]
)
scores = head_scores(model, seq_len=20)
induction = scores["induction"]
for layer in range(1, model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        print(
            f"L{layer}H{head}: attention last -> {key_pos}: {to_key[layer, head]:.3f}   induction score {induction[layer, head]:.3f}"
        )
LAYER, HEAD = divmod(int(to_key[1:].argmax()) + model.cfg.n_heads, model.cfg.n_heads)
PREV = divmod(int(scores["previous token"][:LAYER].argmax()), model.cfg.n_heads)
print(f"the induction head: L{LAYER}H{HEAD}; the previous-token head: L{PREV[0]}H{PREV[1]}")
assert induction[LAYER, HEAD] > 0.5 and scores["previous token"][PREV] > 0.5

# %% [markdown]
# ## 2 · The attribution graph
#
# `attribute` runs the replacement model once and takes one gradient per target to fill
# `adjacency_matrix[target, source]`. The logit targets are the top next tokens, together holding 95% of
# the probability or 10 tokens, whichever comes first.

# %%
graph = attribute(model, tokens, transcoders, max_feature_nodes=MAX_FEATURE_NODES)
print(
    f"{graph.n_features} feature nodes, {graph.n_errors} error nodes, {graph.n_pos} token nodes, {graph.n_logits} logits"
)
print("adjacency", tuple(graph.adjacency_matrix.shape))
for target, p in zip(graph.logit_targets, graph.logit_probabilities.tolist(), strict=True):
    print(f"  logit {target.token_str!r:8} p = {p:.3f}")
assert graph.logit_targets[0].vocab_idx == answer

# %% [markdown]
# The two scores: *replacement* is the share of the influence on the logits (through every path)
# that starts at token embeddings rather than at error nodes, and *completeness* is how much of each
# node's input does not come from error nodes, weighted by the node's influence. `prune_graph` keeps
# the nodes with 80% of the influence and then the edges with 98% of what is left.

# %%
replacement, completeness = compute_graph_scores(graph)
print(f"replacement score {replacement:.3f}, completeness score {completeness:.3f}")
node_mask, edge_mask, cumulative_scores = prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)
print(
    f"pruned: {int(node_mask.sum())} of {len(node_mask)} nodes, {int(edge_mask.sum())} of {int((graph.adjacency_matrix != 0).sum())} edges"
)

# %% [markdown]
# Node `i` of the adjacency is a feature, an error node, a token embedding or a logit, in that order.
# `node(i)` says which one and where, and each node's own share of the influence comes from
# `cumulative_scores` (its cumulative share in rank order, minus that of the node ranked just above it).

# %%
n_feat, n_err, n_pos = graph.n_features, graph.n_errors, graph.n_pos
features = graph.active_features[graph.selected_features]  # [n_features, 3]: layer, pos, feature
activations = graph.activation_values[graph.selected_features]
LOGIT = n_feat + n_err + n_pos  # the top logit's node


def node(i: int) -> tuple[str, int, int, str]:
    """(kind, layer, pos, label) of node i; embeddings are layer -1, logits layer n_layers."""
    if i < n_feat:
        layer, pos, f = features[i].tolist()
        return "feature", layer, pos, f"L{layer} feature {f} at {pos} {str_tokens[pos]!r}"
    if i < n_feat + n_err:
        layer, pos = divmod(i - n_feat, n_pos)
        return "error", layer, pos, f"L{layer} error at {pos} {str_tokens[pos]!r}"
    if i < LOGIT:
        pos = i - n_feat - n_err
        return "embedding", -1, pos, f"embedding at {pos} {str_tokens[pos]!r}"
    return "logit", model.cfg.n_layers, last, f"logit {graph.logit_targets[i - LOGIT].token_str!r}"


order = cumulative_scores.argsort()
share = torch.zeros_like(cumulative_scores)
share[order] = cumulative_scores[order].diff(prepend=cumulative_scores.new_zeros(1))
print("the most influential nodes (logits left out):")
for i in share[:LOGIT].topk(8).indices.tolist():
    print(f"  {share[i]:.3f}  {node(i)[3]}")

# %% [markdown]
# ### The path from the earlier occurrence
#
# A direct effect of a node at an earlier position on the logit at the last position can only travel
# through the frozen attention. Summed by source position, the edges into the top logit come mostly from
# `key_pos`, the earlier ` co`. The strongest single edge is that token's own embedding, which the
# frozen attention carries from `key_pos` to the last position, where the induction heads look.

# %%
into_logit = graph.adjacency_matrix[LOGIT, :LOGIT]
positions = torch.tensor([node(i)[2] for i in range(LOGIT)])
by_pos = torch.zeros(n_pos).index_add_(0, positions, into_logit)
for pos in by_pos.abs().topk(4).indices.tolist():
    print(f"from position {pos:2d} {str_tokens[pos]!r:8}: {by_pos[pos]:+.3f}")
print(f"the strongest edges into logit {str_tokens[key_pos]!r}:")
for i in into_logit.abs().topk(6).indices.tolist():
    print(f"  {into_logit[i]:+.3f}  {node(i)[3]}")
strongest = int(into_logit.abs().argmax())
assert int(by_pos.argmax()) == key_pos and node(strongest)[:3] == ("embedding", -1, key_pos)

# %% [markdown]
# The same path also runs through features. A feature at the last position of the induction head's
# layer takes input from the earlier ` co` (through the same frozen attention) and writes into the
# logit. Along one such two-edge path, the source adds the first edge to the feature's
# pre-activation. Each unit of the feature adds the second edge divided by the feature's activation to
# the logit (an edge from a feature is its activation times its gradient). The product is the
# source's effect on the logit through that feature, and it ranks the features.

# %%
rows = [i for i in range(n_feat) if features[i, 0] == LAYER and features[i, 1] == last]
from_key = graph.adjacency_matrix[rows][:, :LOGIT][:, positions == key_pos].sum(1)  # into each feature from key_pos
to_logit = into_logit[rows]
path = from_key * to_logit / activations[rows]
print(f"{'path':>8}  {'key_pos -> feature':>18}  {'feature -> logit':>16}  {'activation':>10}  feature")
for k in path.abs().topk(5).indices.tolist():
    row = f"{path[k]:+8.3f}  {from_key[k]:+18.3f}  {to_logit[k]:+16.3f}  {activations[rows[k]]:10.3f}"
    print(f"{row}  {node(rows[k])[3]}")
FEATURE_NODE = rows[int(path.argmax())]
_, _, _, FEATURE_LABEL = node(FEATURE_NODE)
FEATURE = int(features[FEATURE_NODE, 2])
assert path.max() > 0 and into_logit[FEATURE_NODE] > 0
print("on the path:", FEATURE_LABEL)

# %% [markdown]
# The pruned graph: each kept node at its position (x) and layer (y), sized by its influence (a logit
# by its probability). Lines show the 40 strongest kept edges (blue positive, red negative); hover for
# labels. The embedding at the earlier ` co` connects straight up to the logit.
#
# What to look at (tiny-gpt2): 43 of 1206 nodes kept. The largest dot is the embedding at
# position 8, the earlier ` co` (influence 0.397, five times the next, the embedding at 21 ` se`,
# 0.078), and its line to the logit ` co` (p = 0.751) is the strongest edge, +6.82; the next
# ones into the logit are far weaker (L1 error at 22 `ven` +0.70). Every line is drawn at the
# same width: only the colour gives the sign (the weights are in the list printed above).


# %%
def weight(i: int) -> float:
    """A node's size in the picture: its influence share, or a logit's probability."""
    return float(graph.logit_probabilities[i - LOGIT] if i >= LOGIT else share[i])


kept = node_mask.nonzero()[:, 0].tolist()
slots: dict[tuple[int, int], list[int]] = {}  # (row, pos) -> the kept nodes there
for i in kept:
    _, layer, pos, _ = node(i)
    slots.setdefault((layer + 1, pos), []).append(i)  # rows: embeddings 0, layer L at L + 1, logits last
xy: dict[int, tuple[float, float]] = {}
for (row, pos), ids in slots.items():
    side = math.ceil(len(ids) ** 0.5)  # the nodes of one slot on a side x side grid
    for k, i in enumerate(ids):
        xy[i] = (pos + 0.8 * ((k % side + 0.5) / side - 0.5), row + 0.6 * ((k // side + 0.5) / side - 0.5))
edges = [(t, s) for t, s in edge_mask.nonzero().tolist()]
edges = sorted(edges, key=lambda e: -abs(float(graph.adjacency_matrix[e])))[:40]
fig = go.Figure()
for sign, color in ((1, "royalblue"), (-1, "crimson")):
    xs, ys = [], []
    for t, s in edges:
        if sign * float(graph.adjacency_matrix[t, s]) > 0:
            xs += [xy[s][0], xy[t][0], None]
            ys += [xy[s][1], xy[t][1], None]
    fig.add_trace(
        go.Scatter(
            x=xs, y=ys, mode="lines", line={"color": color, "width": 1}, opacity=0.5, hoverinfo="skip", showlegend=False
        )
    )
for kind, symbol in (("embedding", "square"), ("feature", "circle"), ("error", "x"), ("logit", "diamond")):
    ids = [i for i in kept if node(i)[0] == kind]
    fig.add_trace(go.Scatter(
        x=[xy[i][0] for i in ids], y=[xy[i][1] for i in ids], mode="markers", name=kind, text=[node(i)[3] for i in ids],
        marker={"symbol": symbol, "size": [6 + 45 * weight(i) ** 0.5 for i in ids]}, hoverinfo="text",
    ))  # fmt: skip
fig.update_layout(
    title=f"{MODEL_NAME}: the pruned attribution graph of {str_tokens[key_pos]!r} (sized by influence)",
    xaxis={"tickvals": list(range(n_pos)), "ticktext": [f"{p} {t!r}" for p, t in enumerate(str_tokens)], "tickangle": -60},
    yaxis={"tickvals": list(range(model.cfg.n_layers + 2)), "ticktext": ["embed", *[f"L{layer}" for layer in range(model.cfg.n_layers)], "logits"]},
    height=520,
    width=950,
)  # fmt: skip
fig.show()

# %% [markdown]
# ## 3 · Intervening on a feature
#
# The graph is linear in the replacement model, so an edge predicts what setting its source to another
# value does: setting a feature of activation `a` to `v` moves the logit by about
# `edge × (v − a) / a`. `feature_intervention` checks this on the real model. It splices the
# transcoders in with their error term (so with no intervention it computes exactly the model's own
# logits), sets the feature, and holds the attention patterns at their clean values. The MLPs and
# LayerNorms run for real. The graph's logit is the demeaned one (the logit minus the mean logit);
# we compare that.

# %%
a = float(activations[FEATURE_NODE])
edge = float(into_logit[FEATURE_NODE])
with torch.no_grad():
    clean_logits = model(tokens[None])[0, -1]
spliced, _ = feature_intervention(model, tokens, transcoders, [])
print(f"no intervention: max |logit - the model's| = {(spliced[0, -1] - clean_logits).abs().max():.1e}")
assert torch.allclose(spliced[0, -1], clean_logits, atol=1e-4)


def demeaned(logits: torch.Tensor) -> float:
    return float(logits[answer] - logits.mean())


print(f"{FEATURE_LABEL}: activation {a:.3f}, edge into logit {str_tokens[key_pos]!r} {edge:+.3f}")
print("  set to    graph predicts   model gives   p(answer)")
print(f"  {a:6.3f}   {0:+14.3f}   {0:+11.3f}   {clean_logits.softmax(-1)[answer]:9.3f}  (clean)")
for value in (0.0, -a, -3 * a, 2 * a):
    logits, _ = feature_intervention(model, tokens, transcoders, [(LAYER, last, FEATURE, value)])
    predicted, actual = edge * (value - a) / a, demeaned(logits[0, -1]) - demeaned(clean_logits)
    p = logits[0, -1].softmax(-1)[answer]
    print(f"  {value:6.3f}   {predicted:+14.3f}   {actual:+11.3f}   {p:9.3f}")
    assert (predicted > 0) == (actual > 0) == (p > clean_logits.softmax(-1)[answer]), (value, predicted, actual)

# %% [markdown]
# Zeroing or flipping the feature lowers the answer's logit and probability, and doubling it raises
# them, as the edge says. In tiny-gpt2 the feature sits in the last layer, so between it and the logit
# only the final LayerNorm's scale is not frozen in the real run: that is why the sizes differ a little
# from the linear prediction. One feature is a small part of the answer here: most of it is the
# embedding copied from the earlier position.
#
# ## 4 · QK attribution: why the induction head looks at the earlier occurrence
#
# The graph froze the attention pattern, so it shows *what* the induction head moved but not *why* it
# attends there. `qk_attribution` splits the head's pre-softmax score at (query = last position,
# key = `key_pos`) exactly. The residual stream at each side is a sum of terms (embedding, position
# embedding, each earlier head's output, each transcoder feature, the transcoders' skip and bias terms,
# the error), and the score is `sum_ij q_i · k_j / sqrt(d_head)`. A `skip L` term is the layer-L
# transcoder's linear skip path. It reads everything layer L's MLP reads, the previous-token head's
# output included, and is kept as one term.

# %%
qk = qk_attribution(model, graph, transcoders, layer=LAYER, head=HEAD, query_pos=last, key_pos=key_pos)
print(f"L{LAYER}H{HEAD} score at ({last}, {key_pos}): {qk.score:.4f}; the split sums to {qk.total:.4f}")
print(f"{len(qk.query_terms)} query-side terms x {len(qk.key_terms)} key-side terms")
assert abs(qk.total - qk.score) < 1e-3 * max(1.0, abs(qk.score))
print("query side:", ", ".join(f"{label} {c:+.2f}" for label, c in qk.top_query_terms(5)))
print("key side:  ", ", ".join(f"{label} {c:+.2f}" for label, c in qk.top_key_terms(5)))
print("top pairs (query term, key term):")
for q_label, k_label, value in qk.top_pairs(5):
    print(f"  {value:+.3f}  {q_label:12} x {k_label}")

# %% [markdown]
# The contrast makes the point. Compare the key at the earlier occurrence of the query's own token
# (`earlier`, the same token as the query) with `key_pos`, the position right after it. A
# same-token head would prefer the former. The induction head prefers the latter, and the key-side
# terms say why. At `key_pos` the terms written by the earlier layers carry the score. The term that
# differs most between the two keys is one of those, not the token or position embedding. The
# previous-token head's output adds more at `key_pos`, where the token before was the query's own.


# %%
def key_side(q: QKAttribution) -> dict[str, float]:
    """Key-side contributions by term, a layer's features summed into one."""
    out: dict[str, float] = {}
    for term, c in zip(q.key_terms, q.key_contributions.tolist(), strict=True):
        label = f"features {term.layer}" if term.kind == "feature" else term.label
        out[label] = out.get(label, 0.0) + c
    return out


same = qk_attribution(model, graph, transcoders, layer=LAYER, head=HEAD, query_pos=last, key_pos=earlier)
at_key, at_same = key_side(qk), key_side(same)
print(
    f"score at key {key_pos} {str_tokens[key_pos]!r}: {qk.score:+.3f};  at key {earlier} {str_tokens[earlier]!r}: {same.score:+.3f}"
)
labels = sorted(at_key.keys() | at_same.keys(), key=lambda k: -abs(at_key.get(k, 0.0) - at_same.get(k, 0.0)))
print(f"  {'key-side term':14} {'at ' + str(key_pos):>7}  {'at ' + str(earlier):>7}")
for label in labels[:6]:
    print(f"  {label:14} {at_key.get(label, 0.0):+7.3f}  {at_same.get(label, 0.0):+7.3f}")
prev = f"head {PREV[0]}.{PREV[1]}"
print(
    f"the previous-token head L{PREV[0]}H{PREV[1]}: {at_key[prev]:+.3f} at {key_pos}, {at_same[prev]:+.3f} at {earlier}"
)
from_layers = sum(c for t, c in zip(qk.key_terms, qk.key_contributions.tolist(), strict=True) if t.layer >= 0)
print(f"key side written by layers < {LAYER}: {from_layers:+.3f} of {qk.score:+.3f}")
assert qk.score > same.score and from_layers > 0.5 * qk.score
assert labels[0] not in ("embed", "pos_embed", "bias") and at_key[prev] > at_same[prev]

# %% [markdown]
# The pairwise matrix for the top terms of each side: rows are query-side terms, columns key-side
# terms, and each cell is that pair's part of the score.
#
# What to look at (tiny-gpt2): two cells carry most of the 11.07: `skip 0 x skip 0` (+5.41) and
# `tc_bias 0 x tc_bias 0` (+3.97); then the query's `skip 0` against the key-side outputs of
# heads 0.0 (the previous-token head, +1.44) and 0.3 (+1.04) and `error 0` (+1.05). A strong
# pair can be missing: `tc_bias 0 x head 0.2` (-1.34, in the list above) is left out because
# head 0.2's key-side total is small, so the picture shows the top terms, not every top pair.

# %%
q_top = qk.query_contributions.abs().topk(8).indices.tolist()
k_top = qk.key_contributions.abs().topk(8).indices.tolist()
go.Figure(
    go.Heatmap(
        z=qk.matrix[q_top][:, k_top].tolist(),
        x=[qk.key_terms[j].label for j in k_top],
        y=[qk.query_terms[i].label for i in q_top],
        colorscale="RdBu",
        zmid=0,
    ),
    layout={"title": f"L{LAYER}H{HEAD}'s score at ({last}, {key_pos}): query term x key term", "height": 420,
            "xaxis_title": "key side", "yaxis_title": "query side", "yaxis_autorange": "reversed"},
).show()  # fmt: skip

# %% [markdown]
# ## 5 · The graph as JSON
#
# `to_json` writes the pruned graph in circuit-tracer's graph JSON (the schema its viewer and
# Neuronpedia read), whole or not at all. Here it goes into the kernel's temporary folder.

# %%
path = to_json(graph, "induction.json", slug="induction", tokenizer=model.tokenizer, scan=f"{MODEL_NAME}-transcoders")
data = json.loads(path.read_text())
print(f"wrote {path.name}: {len(data['nodes'])} nodes, {len(data['links'])} links")
print("metadata:", {k: data["metadata"][k] for k in ("slug", "scan", "node_threshold")})
print("target logit:", next(n["clerp"] for n in data["nodes"] if n["is_target_logit"]))
