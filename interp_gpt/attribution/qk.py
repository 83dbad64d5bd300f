"""QK attribution: why a head attends where it does -- its pre-softmax score at (query, key) split exactly
into query-side and key-side terms of the local replacement model (beyond circuit-tracer: its issue #53,
after https://transformer-circuits.pub/2025/attention-qk/index.html).

The residual stream entering `layer` (replacement.py's model: patterns and LayerNorm scales frozen) is a
sum of terms: `embed`, `pos_embed`, `head L.H` (an earlier head's output z @ W_O, less the part of its
values that is the same at every key), `attn_bias L` (b_O plus that part: the heads' b_V and, LayerNorm
unfolded, ln1.b through W_V; what fold_ln and fold_value_biases move into b_O, so the split is the same on a
processed and an unprocessed model), `feature L.F` (activation x decoder row), `tc_bias L` (b_dec), `skip L`
(the transcoder's skip term), `error L` (hook_mlp_out minus the reconstruction). No position is zeroed (the BOS
is often where heads look). With ln1's scale frozen each term goes through ln1 and W_Q (W_K) alone, ln1.b
with b_Q (b_K) one more term, "bias"; so `score = q . k / sqrt(d_head) = matrix.sum()`, `matrix[i, j] =
q_i . k_j / sqrt(d_head)`: the head's `hook_attn_scores` at (query_pos, key_pos) to float error. A row's
sum is the change in the score when that query-side term is removed (the key side held); a column's likewise.

Example (tiny-gpt2; induction head L1H0 at a token's second occurrence looks after its first occurrence):
    >>> import torch
    >>> from interp_gpt import GPT
    >>> from interp_gpt.attribution import qk_attribution
    >>> from interp_gpt.sae.training import shipped_transcoders
    >>> model = GPT.from_pretrained("tiny-gpt2")
    >>> rand = torch.randint(100, 2000, (8,), generator=torch.Generator().manual_seed(0))
    >>> tokens = torch.cat([rand, rand])  # a BOS is put first: 1..8, then 9..16
    >>> qk = qk_attribution(model, tokens, shipped_transcoders(model), layer=1, head=0, query_pos=12, key_pos=5)
    >>> abs(qk.total - qk.score) < 1e-4
    True
    >>> [label for label, contribution in qk.top_key_terms(3)]  # the key side: layer 0 (L0H0 is the prev-token head)
    ['skip 0', 'tc_bias 0', 'head 0.0']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..checks import check_index
from ..sae.transcoders.clt import CrossLayerTranscoder
from ..sae.transcoders.transcoder import Transcoder
from ._inputs import prepare
from .graph import AttributionGraph
from .replacement import Readers, freezing_hooks

__all__ = ["QKAttribution", "QKTerm", "qk_attribution"]

_CALLER = "qk_attribution"


class QKTerm(NamedTuple):
    """One term of a side: `kind` (embed, pos_embed, head, attn_bias, feature, tc_bias, skip, error,
    bias), the
    layer that wrote it (-1 for embed, pos_embed and bias) and `which` head or feature (-1 for the others)."""

    kind: str
    layer: int
    which: int

    @property
    def label(self) -> str:
        """A short name for the term, e.g. `embed`, `head 1.0` or `mlp 0`."""
        if self.kind in ("embed", "pos_embed", "bias"):
            return self.kind
        if self.kind in ("head", "feature"):
            return f"{self.kind} {self.layer}.{self.which}"
        return f"{self.kind} {self.layer}"


@dataclass
class QKAttribution:
    """Head `head` of layer `layer`'s score at (`query_pos`, `key_pos`), split over its terms.

    query_terms / key_terms: the terms of each side (`QKTerm`s), "bias" last.
    query_vectors / key_vectors: `[n, d_model]` each term's vector in the residual stream (the bias's is 0).
    query_parts / key_parts: `[n, d_head]` each term's part of q (k): q = query_parts.sum(0).
    matrix: `[n_query_terms, n_key_terms]` q_i . k_j / sqrt(d_head).
    score: the head's own pre-softmax score (hook_attn_scores) at (query_pos, key_pos).
    tokens: the prompt's token ids, BOS included (positions index these).
    """

    layer: int
    head: int
    query_pos: int
    key_pos: int
    query_terms: list[QKTerm]
    key_terms: list[QKTerm]
    query_vectors: Tensor
    key_vectors: Tensor
    query_parts: Tensor
    key_parts: Tensor
    matrix: Tensor
    score: float
    tokens: Tensor

    @property
    def query_contributions(self) -> Tensor:
        """`[n_query_terms]` each query-side term's contribution to the score (its row's sum)."""
        return self.matrix.sum(1)

    @property
    def key_contributions(self) -> Tensor:
        """`[n_key_terms]` each key-side term's contribution to the score (its column's sum)."""
        return self.matrix.sum(0)

    @property
    def total(self) -> float:
        """The sum of the matrix: the score, to float error."""
        return float(self.matrix.sum())

    def top_query_terms(self, k: int = 10) -> list[tuple[str, float]]:
        """The `k` query-side terms of largest |contribution|, as (label, contribution)."""
        return _top(self.query_terms, self.query_contributions, k)

    def top_key_terms(self, k: int = 10) -> list[tuple[str, float]]:
        """The `k` key-side terms of largest |contribution|, as (label, contribution)."""
        return _top(self.key_terms, self.key_contributions, k)

    def top_pairs(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The `k` (query term, key term) pairs of largest |matrix entry|, as (query, key, value)."""
        flat = self.matrix.flatten()
        idx = flat.abs().argsort(descending=True)[:k]
        n_k = self.matrix.shape[1]
        return [(self.query_terms[i // n_k].label, self.key_terms[i % n_k].label, float(flat[i])) for i in idx.tolist()]


def _top(terms: list[QKTerm], values: Tensor, k: int) -> list[tuple[str, float]]:
    idx = values.abs().argsort(descending=True)[:k]
    return [(terms[i].label, float(values[i])) for i in idx.tolist()]


def qk_attribution(
    model: Any,
    prompt: str | Tensor | list[int] | AttributionGraph,
    transcoders: list[Transcoder] | CrossLayerTranscoder,
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
) -> QKAttribution:
    """Head `head` of layer `layer`'s pre-softmax score at (`query_pos`, `key_pos`), split exactly into
    query-side and key-side terms of the local replacement model (see the module's docs).

    Args:
        model: a `GPT` (standard position embeddings).
        prompt: text or token ids, as `attribute` takes it (a BOS is put first unless there is one), or an
            `AttributionGraph` (its input tokens: the positions are the graph's).
        transcoders: one `Transcoder` per layer or a `CrossLayerTranscoder`, as `attribute` takes them.
        layer: the head's layer (negative counts from the end).
        head: the head (negative counts from the end).
        query_pos: the query's position in the prompt's tokens, BOS included (negative counts from the end).
        key_pos: the key's position, as `query_pos`; at or before the query.
    """
    if isinstance(prompt, AttributionGraph):
        prompt = prompt.input_tokens
    model, tokens, readers = prepare(model, prompt, transcoders, _CALLER)
    cfg = model.cfg
    layer = check_index(layer, cfg.n_layers, "layer", "layers", caller=_CALLER)
    head = check_index(head, cfg.n_heads, "head", "heads", caller=_CALLER)
    n_pos = tokens.shape[0]
    query_pos = check_index(
        query_pos, n_pos, "query_pos", f"positions of the {n_pos}-token prompt (BOS included)", caller=_CALLER
    )
    key_pos = check_index(
        key_pos, n_pos, "key_pos", f"positions of the {n_pos}-token prompt (BOS included)", caller=_CALLER
    )
    if key_pos > query_pos:
        raise ValueError(
            f"{_CALLER}: key_pos={key_pos} is after query_pos={query_pos}; the head attends causally, to keys at "
            "or before its query"
        )
    if cfg.positional_embedding_type != "standard":
        raise ValueError(
            f"{_CALLER}: model.cfg.positional_embedding_type={cfg.positional_embedding_type!r}; QK attribution "
            "splits the residual stream of models with 'standard' position embeddings"
        )

    rec = _record(model, tokens, readers, layer)
    positions = (query_pos, key_pos)
    sides = []
    for side, pos in zip(("q", "k"), positions, strict=True):
        terms, vectors = _terms(model, readers, rec, layer, pos)
        parts = _project(model, rec, layer, head, pos, vectors, side)
        sides.append((terms + [QKTerm("bias", -1, -1)], torch.cat([vectors, vectors.new_zeros(1, cfg.d_model)]), parts))
    (q_terms, q_vecs, q_parts), (k_terms, k_vecs, k_parts) = sides
    matrix = (q_parts @ k_parts.T) / math.sqrt(cfg.d_head)
    score = float(rec["scores"][head, query_pos, key_pos])
    return QKAttribution(
        layer, head, query_pos, key_pos, q_terms, k_terms, q_vecs, k_vecs, q_parts, k_parts, matrix, score, tokens
    )


def _record(model: Any, tokens: Tensor, readers: Readers, layer: int) -> dict[str, Any]:
    """One clean pass up to `layer`'s attention, recording what the terms are made of."""
    rec: dict[str, Any] = {"z": {}, "mlp_out": {}, "x": {}}

    def keep(key: str, sub: int | None = None) -> Any:
        def hook(t: Tensor, hook: Any) -> Tensor:
            if sub is None:
                rec[key] = t[0].detach()
            else:
                rec[key][sub] = t[0].detach()
            return t

        return hook

    a = f"blocks.{layer}"
    hooks = freezing_hooks(model) + [
        ("hook_embed", keep("embed")),
        ("hook_pos_embed", keep("pos_embed")),
        (f"{a}.hook_resid_pre", keep("resid")),
        (f"{a}.ln1.hook_scale", keep("scale")),
        (f"{a}.attn.hook_attn_scores", keep("scores")),
    ]
    for lay in range(layer):
        hooks += [
            (f"blocks.{lay}.attn.hook_z", keep("z", lay)),
            (f"blocks.{lay}.hook_mlp_out", keep("mlp_out", lay)),
            (readers.input_hook(lay), keep("x", lay)),
        ]
    # A model without LayerNorm (normalization_type=None) has no ln1.hook_scale: nothing to record there.
    hooks = [(name, fn) for name, fn in hooks if name in model.hook_dict]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(tokens[None], stop_at_layer=layer + 1)
    return rec


def _terms(model: Any, readers: Readers, rec: dict[str, Any], layer: int, pos: int) -> tuple[list[QKTerm], Tensor]:
    """The terms of the residual stream entering `layer` at `pos`, and `[n, d_model]` their vectors."""
    terms = [QKTerm("embed", -1, -1), QKTerm("pos_embed", -1, -1)]
    vectors = [rec["embed"][pos], rec["pos_embed"][pos]]
    blocks = model.blocks
    for lay in range(layer):
        attn, W_O = blocks[lay].attn, blocks[lay].attn.W_O.detach()
        # Each head's value has a constant part, b_V and (LayerNorm unfolded) ln1.b @ W_V, the same at every
        # key: the pattern sums to 1, so it reaches z whole. It goes with b_O into "attn_bias", as fold_ln and
        # fold_value_biases put it there: the split is the same whatever the processing of the model.
        const = _value_constant(blocks[lay])  # [n_heads, d_head]
        z = rec["z"][lay][pos] - const  # [n_heads, d_head]
        heads = torch.einsum("hd,hdm->hm", z, W_O)
        bias = attn.b_O.detach() + torch.einsum("hd,hdm->m", const, W_O)
        terms += [QKTerm("head", lay, h) for h in range(heads.shape[0])] + [QKTerm("attn_bias", lay, -1)]
        vectors += list(heads) + [bias]

    # The transcoders' parts of the MLP outputs of layers < layer, at `pos`.
    dtype = rec["resid"].dtype
    with torch.no_grad():
        x = [rec["x"][lay][pos][None] for lay in range(layer)]
        acts = [readers.encode(lay, x[lay])[0] for lay in range(layer)]
        # Every layer's activations as the reconstruction reads them (layers >= `layer` are never read
        # by the reconstruction of a layer below it: zeros).
        pad = [acts[0].new_zeros(1, acts[0].shape[-1])] * (readers.n_layers - layer) if layer else []
        full = [a[None] for a in acts] + pad
        none = [torch.zeros_like(a) for a in full]
        for lay in range(layer):  # features of source layer `lay`, into the layers below `layer`
            feats = acts[lay].nonzero()[:, 0]
            if feats.numel():
                rows, outs = readers.decoder_rows(lay, feats)  # [n, n_out, d_model], [n_out]
                below = (outs < layer).to(rows.device)
                written = (rows * below[None, :, None]).sum(1) * acts[lay][feats, None]
                terms += [QKTerm("feature", lay, int(f)) for f in feats.tolist()]
                vectors += list(written.to(dtype))
        for lay in range(layer):
            recon0 = readers.reconstruction(lay, none, x[lay])[0]
            recon = readers.reconstruction(lay, full, x[lay])[0]
            skip = readers.skip(lay, x[lay])
            skip = torch.zeros_like(recon0) if skip is None else skip[0]
            terms += [QKTerm("tc_bias", lay, -1), QKTerm("skip", lay, -1), QKTerm("error", lay, -1)]
            vectors += [(recon0 - skip).to(dtype), skip.to(dtype), rec["mlp_out"][lay][pos] - recon.to(dtype)]
    return terms, torch.stack([v.to(dtype) for v in vectors])


def _value_constant(block: Any) -> Tensor:
    """`[n_heads, d_head]` the part of every value of `block`'s heads that is the same at every position:
    b_V, plus ln1's bias through W_V where ln1 has its parameters (a model loaded with fold_ln=False)."""
    attn, ln = block.attn, block.ln1
    const = attn.b_V.detach()
    if getattr(ln, "has_params", False):
        const = const + torch.einsum("m,hmd->hd", ln.b.detach(), attn.W_V.detach())
    return const


def _project(model: Any, rec: dict[str, Any], layer: int, head: int, pos: int, vectors: Tensor, side: str) -> Tensor:
    """`[n + 1, d_head]` each term's part of q (side "q") or k ("k") through the frozen ln1, and the bias
    (ln1's b through W, plus b_Q / b_K) last."""
    block = model.blocks[layer]
    attn, ln = block.attn, block.ln1
    W = (attn.W_Q if side == "q" else attn.W_K).detach()[head]  # [d_model, d_head]
    b = (attn.b_Q if side == "q" else attn.b_K).detach()[head]  # [d_head]
    if model.cfg.normalization_type is None:
        normed, bias = vectors, b
    else:
        scale = rec["scale"][pos].reshape(-1)
        scale = scale[head] if scale.numel() > 1 else scale[0]  # per head with use_split_qkv_input
        normed = (vectors - vectors.mean(-1, keepdim=True)) / scale
        if ln.has_params:
            normed = normed * ln.w.detach()
            bias = ln.b.detach() @ W + b
        else:
            bias = b
    return torch.cat([normed @ W, bias[None]])
