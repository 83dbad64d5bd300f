"""Phases 0 and 1 of `attribute`: the local replacement model on our hook points, and the forward pass.

The local replacement model (circuit-tracer's `TransformerLensReplacementModel`, built here from hooks
on an unchanged `GPT`, with no subclass and no copy of its forward):

    attention patterns   blocks.L.attn.hook_pattern   detached: frozen, gradients flow through the values only
    LayerNorm scales     blocks.L.ln1/ln2.hook_scale, ln_final.hook_scale   detached: LayerNorms are linear
    MLPs                 blocks.L.hook_mlp_out -> skip(x_L) + (mlp_out - skip(x_L)).detach(): the forward
                         values are the model's own, and gradients leave each MLP only through the
                         transcoders' skip (zero without one) into their input x_L

so the residual stream is linear in the MLP outputs and the token embeddings (the "sources"), and every
direct effect is one gradient. The forward pass of one copy of the prompt records, for each layer, the
transcoders' input x_L (the "targets" of feature rows), the MLP output (where feature, error and
embedding rows are read) and the token embeddings; the features, error vectors and decoder rows come
from the same pass. The backward passes batch their targets over that one copy's graph
(`torch.autograd.grad(..., is_grads_batched=True)`): no forward pass of `batch_size` copies (on GPT-2
small at circuit-tracer's batch of 512, that pass alone took 11 s of a 17.7 s graph on one CPU thread),
and each batch runs over the shortest prefix of the prompt worth building (`Prefixes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..sae.mapped import FileWeight, file_weight
from ..sae.transcoders.clt import CrossLayerTranscoder
from ..sae.transcoders.transcoder import Transcoder, activate

__all__: list[str] = []


class Readers:
    """Per-layer transcoders (a list, one per layer) or one cross-layer transcoder, read the one way the
    attribution needs: each layer's input hook, encoder, decoder rows (into which layers), skip and
    reconstruction. Weights loaded lazily (interp_gpt.sae.mapped) are read from their files through a
    map of their own, given back when done: one layer's matrix at a time, or only the rows asked for;
    the numbers are an eager load's, bit for bit."""

    def __init__(self, transcoders: list[Transcoder] | CrossLayerTranscoder, n_layers: int):
        self.plts = transcoders if isinstance(transcoders, list) else None
        self.clt = transcoders if isinstance(transcoders, CrossLayerTranscoder) else None
        self.n_layers = n_layers

    def input_hook(self, layer: int) -> str:
        hook = self.plts[layer].input_hook if self.plts is not None else self.clt.input_hook(layer)  # type: ignore[union-attr]
        assert hook is not None
        return hook

    @property
    def dtype(self) -> torch.dtype:
        return self.plts[0].dtype if self.plts is not None else self.clt.dtype  # type: ignore[union-attr]

    def encoder(self, layer: int) -> Tensor:
        """`[d_in, d_sae]` layer `layer`'s encoder (as the module holds it: lazily, a map not read yet)."""
        return self.plts[layer].W_enc if self.plts is not None else self.clt.W_enc[layer]  # type: ignore[union-attr]

    def file(self, layer: int, name: str) -> FileWeight | None:
        """The file layer `layer`'s `name` ("W_enc" or "W_dec") is read from, where loaded lazily."""
        if self.plts is not None:
            return file_weight(self.plts[layer], name)
        return file_weight(self.clt, f"W_dec.{layer}") if name == "W_dec" else None  # a CLT's W_enc: read

    def encoder_columns(self, layer: int, features: Tensor) -> Tensor:
        """`[d_in, n]` the encoder columns of layer `layer`'s `features`."""
        f = self.file(layer, "W_enc")
        return f.columns(features) if f is not None else self.encoder(layer)[:, features]

    def encode(self, layer: int, x: Tensor) -> Tensor:
        """Layer `layer`'s feature activations of its input `x`."""
        if self.plts is not None:
            tc, f = self.plts[layer], self.file(layer, "W_enc")
            threshold = tc.threshold if tc.cfg.architecture == "jumprelu" else None
            w_enc = f.read() if f is not None else tc.W_enc
            return activate(x.to(tc.dtype) @ w_enc + tc.b_enc, tc.cfg, threshold)
        return self.clt._encode(x.to(self.dtype), layer, hooked=False)  # type: ignore[union-attr]

    def decoder_rows(self, layer: int, features: Tensor) -> tuple[Tensor, Tensor]:
        """(`[n, n_out, d_model]` the decoder rows of layer `layer`'s `features` into each layer they write,
        `[n_out]` those layers)."""
        f = self.file(layer, "W_dec")
        if self.plts is not None:
            rows = f.rows(features) if f is not None else self.plts[layer].W_dec[features]
            return rows[:, None], torch.tensor([layer])
        w = f.rows(features) if f is not None else self.clt.W_dec[layer][features]  # type: ignore[union-attr]
        return w, torch.arange(layer, self.n_layers)

    def skip(self, layer: int, x: Tensor) -> Tensor | None:
        """The skip term of layer `layer` on its input `x` (None without a skip)."""
        if self.plts is not None:
            tc = self.plts[layer]
            return x.to(tc.dtype) @ tc.W_skip.T if tc.cfg.skip else None
        clt = self.clt
        assert clt is not None
        return x.to(clt.dtype) @ clt.W_skip[layer].T if clt.cfg.skip else None

    def reconstruction(self, layer: int, acts: list[Tensor], x: Tensor) -> Tensor:
        """Layer `layer`'s predicted MLP output (b_dec and skip included) from the activations of every
        layer (`acts[l]`) and its input `x`."""
        if self.plts is not None:
            tc, f, a = self.plts[layer], self.file(layer, "W_dec"), acts[layer]
            if a.ndim == 2 and int(a.count_nonzero()) * 64 <= a.numel():  # sparse: only the active rows read
                out = self._sparse_decode(layer, a.to(tc.dtype)) + tc.b_dec
            elif f is None:
                return tc._decode(a, x, hooked=False)
            else:
                out = a.to(tc.dtype) @ f.read() + tc.b_dec  # Transcoder._decode's arithmetic
            return out + x.to(tc.dtype) @ tc.W_skip.T if tc.cfg.skip else out
        return self.reconstructions(acts, [x] * self.n_layers, only=layer)[0]

    def _sparse_decode(self, layer: int, acts: Tensor, chunk: int = 2**16) -> Tensor:
        """`acts` `[pos, d_sae]` (few active) times layer `layer`'s decoder, reading only the active features'
        rows (from the file, where loaded lazily): the same sums as the matmul's but for rounding, a
        fraction of the reads (a decoder of width 24,576 is 75 MB; 16 active features a position, 0.05 MB)."""
        pos, feat = acts.nonzero(as_tuple=True)
        out = acts.new_zeros(acts.shape[0], self.plts[layer].d_out)  # type: ignore[index]
        for i in range(0, pos.shape[0], chunk):
            p, f = pos[i : i + chunk], feat[i : i + chunk]
            rows, _ = self.decoder_rows(layer, f)
            out.index_add_(0, p, rows[:, 0] * acts[p, f, None])
        return out

    def reconstructions(self, acts: list[Tensor], xs: list[Tensor], only: int | None = None) -> list[Tensor]:
        """Every layer's predicted MLP output (`xs[l]`: layer l's input), or only layer `only`'s (a list of
        it alone). A lazy CLT reads each decoder file a slice at a time, adding its terms into every layer it
        writes in CrossLayerTranscoder._decode's order (the same sums, bit for bit)."""
        n = self.n_layers
        layers = range(n) if only is None else [only]
        if self.plts is not None:
            return [self.reconstruction(layer, acts, xs[layer]) for layer in layers]
        clt = self.clt
        assert clt is not None
        top = max(layers)
        partial: list[Any] = [0] * n  # sum(...) starts from 0, as CrossLayerTranscoder._decode's
        for s in range(top + 1):
            f = self.file(s, "W_dec")
            for m in layers:
                if m >= s:  # a lazy decoder through a fresh map per slice: only that slice's pages are read
                    w = f.read() if f is not None else clt.W_dec[s]  # [d_sae, n - s, d_out]
                    partial[m] = partial[m] + acts[s] @ w[:, m - s]
                    del w
        out = []
        for m in layers:
            y = clt.b_dec[m] + partial[m]
            out.append(y + xs[m].to(clt.dtype) @ clt.W_skip[m].T if clt.cfg.skip else y)
        return out


def _detach(t: Tensor, hook: Any) -> Tensor:
    return t.detach()


def freezing_hooks(model: Any) -> list[tuple[str, Any]]:
    """The local replacement model's freezes: attention patterns and every LayerNorm scale detached."""
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(model.cfg.n_layers)]
    names += [f"blocks.{i}.{ln}.hook_scale" for i in range(model.cfg.n_layers) for ln in ("ln1", "ln2")]
    names.append("ln_final.hook_scale")
    return [(n, _detach) for n in names if n in model.hook_dict]


@dataclass
class Prefix:
    """The local replacement model's autograd graph over the prompt's first `n` positions, one copy (the
    backward passes batch their targets over it: `torch.autograd.grad(..., is_grads_batched=True)`).

    inputs:        per layer, `[1, n, d_in]` the transcoders' input x_L
    mlp_outs:      per layer, `[1, n, d_model]` what the replaced MLP wrote (its gradient is the direct
                   effect per unit of anything written there)
    embeds:        `[1, n, d_model]` hook_embed's output
    final:         `[1, n, d_model]` ln_final's output (the unembedding's input)
    """

    inputs: list[Tensor]
    mlp_outs: list[Tensor]
    embeds: Tensor
    final: Tensor

    @property
    def n(self) -> int:
        return int(self.embeds.shape[1])


@dataclass
class ForwardPass:
    """What the forward pass of the local replacement model gave: its graph over the whole prompt, and

    logits:        `[pos, d_vocab]` the model's logits (its own: the replacement changes no value)
    activations:   per layer, `[pos, d_sae]` the feature activations, position 0 zeroed
    errors:        `[n_layers, pos, d_model]` hook_mlp_out minus the reconstruction, position 0 zeroed
    """

    graph: Prefix
    logits: Tensor
    activations: list[Tensor]
    errors: Tensor


def replacement_graph(model: Any, tokens: Tensor, readers: Readers) -> Prefix:
    """The local replacement model's forward pass of `tokens` `[n]` (one copy), recording what the backward
    passes read."""
    n_layers = model.cfg.n_layers
    inputs: list[Tensor | None] = [None] * n_layers
    mlp_outs: list[Tensor | None] = [None] * n_layers
    embeds: list[Tensor] = []

    def read_input(x: Tensor, hook: Any, layer: int) -> Tensor:
        inputs[layer] = x
        return x

    def replace_mlp(out: Tensor, hook: Any, layer: int) -> Tensor:
        x = inputs[layer]
        assert x is not None, f"{readers.input_hook(layer)} ran after blocks.{layer}.hook_mlp_out"
        skip = readers.skip(layer, x)
        written = (
            out.detach().requires_grad_(True)
            if skip is None
            else skip.to(out.dtype) + (out - skip.to(out.dtype)).detach()
        )
        mlp_outs[layer] = written
        return written

    def read_embed(e: Tensor, hook: Any) -> Tensor:
        e = e.detach().requires_grad_(True)
        embeds.append(e)
        return e

    hooks = freezing_hooks(model) + [("hook_embed", read_embed)]
    # with the patterns frozen no gradient reaches the queries and keys: detached, their products' graph
    # (and the weights it keeps side by side, 2 d^2 a layer: 57 MB on GPT-2 small) is freed as the pass goes
    hooks += [(f"blocks.{i}.attn.hook_{qk}", _detach) for i in range(n_layers) for qk in "qk"]
    for layer in range(n_layers):
        hooks.append((readers.input_hook(layer), lambda x, hook, layer=layer: read_input(x, hook, layer)))
        hooks.append((f"blocks.{layer}.hook_mlp_out", lambda o, hook, layer=layer: replace_mlp(o, hook, layer)))
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        final = model.ln_final(model(tokens[None], stop_at_layer=n_layers))
    xs = [x for x in inputs if x is not None]
    outs = [o for o in mlp_outs if o is not None]
    assert len(xs) == len(outs) == n_layers and len(embeds) == 1
    return Prefix(xs, outs, embeds[0], final)


def run_forward(model: Any, tokens: Tensor, readers: Readers, zero_positions: slice) -> ForwardPass:
    """Phase 1: run `tokens` through the local replacement model, recording what the backward passes read,
    and the features and error vectors of the prompt."""
    n_layers = model.cfg.n_layers
    graph = replacement_graph(model, tokens, readers)
    with torch.no_grad():
        logits = model.unembed(graph.final.detach())[0]
        clean_x = [x[0].detach() for x in graph.inputs]
        activations = [readers.encode(layer, clean_x[layer]).clone() for layer in range(n_layers)]
        for acts in activations:
            acts[zero_positions] = 0
        recons = readers.reconstructions(activations, clean_x)
        outs = [out[0].detach() for out in graph.mlp_outs]
        errors = torch.stack([outs[layer] - recons[layer].to(outs[layer].dtype) for layer in range(n_layers)])
        del recons
        errors[:, zero_positions] = 0
    return ForwardPass(graph, logits, activations, errors)


class Prefixes:
    """The graphs the backward passes run over. A target at position p reads nothing after p (attention is
    causal), so a batch of targets up to position p can run over the graph of the first p + 1 positions
    rather than the whole prompt's: its backward pass costs in proportion to the positions it runs over.
    A shorter graph costs a forward pass of one copy (bound by reading the weights on a short prompt), so
    `plan` picks, for batches taken in order of position, the lengths that cost least in all, in
    multiply-adds: a forward pass `L (4 d^2 + 2 d d_mlp) (n + 48)` (reading the weights takes as long as
    about 48 positions' products: 90 ms for GPT-2 small on one CPU thread), a backward pass `2 d^2` per
    target, position and attention layer it runs through (the value and output projections: patterns and
    LayerNorm scales are frozen). One graph is held at a time. On GPT-2 small at batch 16 this took the
    backward passes of an 8-token prompt from 2.9 to 2.0 s (and 0.3 s of forward passes for 4 graphs).

    Example (tiny-gpt2 and its transcoders: batches that need the whole prompt keep the graph held)
        >>> from interp_gpt.attribution._inputs import prepare
        >>> model, tokens, readers = prepare(model, "The cat sat on the mat because", tcs, "attribute")
        >>> prefixes = Prefixes(model, tokens, readers, replacement_graph(model, tokens, readers))
        >>> prefixes.plan(torch.tensor([10, 10]), torch.tensor([16, 16]))  # the prompt's 10 positions
        [10, 10]
    """

    def __init__(self, model: Any, tokens: Tensor, readers: Readers, first: Prefix):
        self.model, self.tokens, self.readers, self.current = model, tokens, readers, first
        cfg = model.cfg
        self.forward_cost = cfg.n_layers * (4 * cfg.d_model**2 + 2 * cfg.d_model * max(cfg.d_mlp, 0))
        self.backward_cost = 2 * cfg.d_model**2

    def plan(self, needed: Tensor, work: Tensor) -> list[int]:
        """The graph length each batch runs over: `needed` `[n_batches]` (ascending) the positions each batch
        reads, `work` its targets times the layers its backward pass runs through. Each run of batches
        shares one graph as long as its last one needs, or the graph held now (free); the runs that cost
        least in all (a dynamic programme over the batches)."""
        n, held = needed.shape[0], self.current.n
        before = torch.cat([torch.zeros(1, dtype=torch.float64), (work.double() * self.backward_cost).cumsum(0)])
        best = torch.zeros(n + 1, dtype=torch.float64)  # best[j]: the least cost of batches 0..j-1
        start, keep = [0] * (n + 1), [False] * (n + 1)
        for j in range(1, n + 1):  # batches i..j-1 over one new graph of length needed[j - 1]
            length = float(needed[j - 1])
            costs = best[:j] + self.forward_cost * (length + 48) + (before[j] - before[:j]) * length
            i = int(costs.argmin())
            best[j], start[j] = costs[i], i
            if held >= length and float(before[j]) * held <= float(best[j]):  # 0..j-1 all over the held one
                best[j], start[j], keep[j] = float(before[j]) * held, 0, True
        lengths = [0] * n
        j = n
        while j > 0:
            i = start[j]
            lengths[i:j] = [held if keep[j] else int(needed[j - 1])] * (j - i)
            j = i
        return lengths

    def get(self, length: int) -> Prefix:
        """The graph over the first `length` positions (the one held, or a new one built in its place)."""
        if not 0 < length <= self.tokens.shape[0]:
            raise ValueError(f"Prefixes.get: length={length}: expected 1..{self.tokens.shape[0]} (the prompt's)")
        if self.current.n != length:
            self.current = None  # type: ignore[assignment]  # the old graph freed before the new one is built
            self.current = replacement_graph(self.model, self.tokens[:length], self.readers)
        return self.current
