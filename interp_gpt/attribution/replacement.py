"""Phases 0 and 1 of `attribute`: the local replacement model on our hook points, and the forward pass.

The local replacement model (circuit-tracer's `TransformerLensReplacementModel`, built here from hooks
on an unchanged `GPT`, with no subclass and no copy of its forward):

    attention patterns   blocks.L.attn.hook_pattern   detached: frozen, gradients flow through the values only
    LayerNorm scales     blocks.L.ln1/ln2.hook_scale, ln_final.hook_scale   detached: LayerNorms are linear
    MLPs                 blocks.L.hook_mlp_out -> skip(x_L) + (mlp_out - skip(x_L)).detach(): the forward
                         values are the model's own, and gradients leave each MLP only through the
                         transcoders' skip (zero without one) into their input x_L

so the residual stream is linear in the MLP outputs and the token embeddings (the "sources"), and every
direct effect is one gradient. The forward pass records, for each layer, the transcoders' input x_L (the
"targets" of feature rows), the MLP output (where feature, error and embedding rows are read) and the
token embeddings; the features, error vectors and decoder rows come from the same pass.
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
            tc, f = self.plts[layer], self.file(layer, "W_dec")
            if f is None:
                return tc._decode(acts[layer], x, hooked=False)
            out = acts[layer].to(tc.dtype) @ f.read() + tc.b_dec  # Transcoder._decode's arithmetic
            return out + x.to(tc.dtype) @ tc.W_skip.T if tc.cfg.skip else out
        return self.reconstructions(acts, [x] * self.n_layers, only=layer)[0]

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
class ForwardPass:
    """What the forward pass of the local replacement model recorded (a `batch` of copies of the prompt).

    inputs:        per layer, `[batch, pos, d_in]` the transcoders' input x_L (in the autograd graph)
    mlp_outs:      per layer, `[batch, pos, d_model]` what the replaced MLP wrote (its gradient is the
                   direct effect per unit of anything written there)
    embeds:        `[batch, pos, d_model]` hook_embed's output
    final:         `[batch, pos, d_model]` ln_final's output (the unembedding's input)
    logits:        `[pos, d_vocab]` the model's logits (its own: the replacement changes no value)
    activations:   per layer, `[pos, d_sae]` the feature activations, position 0 zeroed
    errors:        `[n_layers, pos, d_model]` hook_mlp_out minus the reconstruction, position 0 zeroed
    """

    inputs: list[Tensor]
    mlp_outs: list[Tensor]
    embeds: Tensor
    final: Tensor
    logits: Tensor
    activations: list[Tensor]
    errors: Tensor


def run_forward(model: Any, tokens: Tensor, readers: Readers, batch: int, zero_positions: slice) -> ForwardPass:
    """Phase 1: run `batch` copies of `tokens` through the local replacement model, recording what the
    backward passes read, and the features and error vectors of the prompt."""
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
    for layer in range(n_layers):
        hooks.append((readers.input_hook(layer), lambda x, hook, layer=layer: read_input(x, hook, layer)))
        hooks.append((f"blocks.{layer}.hook_mlp_out", lambda o, hook, layer=layer: replace_mlp(o, hook, layer)))
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        resid = model(tokens[None].expand(batch, -1), stop_at_layer=n_layers)
        final = model.ln_final(resid)
        logits = model.unembed(final[:1].detach())[0]  # the copies' logits are the same

    xs = [x for x in inputs if x is not None]
    outs = [o for o in mlp_outs if o is not None]
    assert len(xs) == len(outs) == n_layers and len(embeds) == 1
    with torch.no_grad():
        clean_x = [x[0].detach() for x in xs]
        activations = [readers.encode(layer, clean_x[layer]).clone() for layer in range(n_layers)]
        for acts in activations:
            acts[zero_positions] = 0
        recons = readers.reconstructions(activations, clean_x)
        errors = torch.stack(
            [outs[layer][0].detach() - recons[layer].to(outs[layer].dtype) for layer in range(n_layers)]
        )
        del recons
        errors[:, zero_positions] = 0
    return ForwardPass(xs, outs, embeds[0], final, logits, activations, errors)
