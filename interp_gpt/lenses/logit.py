"""The logit lens over layers, as transformer-lens 4.3's `tools.analysis.logit_lens`.

The logit lens (nostalgebraist, 2020) reads the residual stream entering every layer, and the
one leaving the last, through the model's own final LayerNorm (its statistics recomputed on each
vector) and unembedding: "what would the model predict if it stopped here?". The phases:

1. one forward pass that caches the residual stream only (`run_with_cache`, names_filter to the
   `hook_resid_pre` of every layer, `hook_resid_mid` with `incl_mid`, and the last `hook_resid_post`);
2. the stack `[n_entries, batch, pos, d_model]`, labelled as `accumulated_resid` labels it
   (`"0_pre"`, `"0_mid"`, ..., `"final_post"`), at the chosen `positions`;
3. `ln_final` then `W_U`, `b_U` on every vector (`readout`).

The last entry equals the model's own logits. `interp_gpt.inspect.cache_logit_lens(cache)` reads one
prompt of a cache you already have; this one runs the model and reads a batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from ..checks import check_int_in_range, check_tokens, check_type
from ..model.gpt import GPT
from ..slices import Slice, SliceInput, slice_index

__all__ = ["LogitLensResult", "logit_lens", "readout"]


@dataclass
class LogitLensResult:
    """What `logit_lens` returns, as transformer-lens 4.3's `LogitLensResult` holds it.

    `values`: the logits `[n_entries, batch, pos, d_vocab]`; an int `positions` (the default, -1)
    drops the pos axis, as transformer-lens' `Slice` does. `labels`: one per entry, `"0_pre"` ...
    `"final_post"`. `positions`: the positions read (non-negative; one per prompt where prompts of unequal
    lengths are each read at their own int position).

    Example:
        >>> result = logit_lens(model, "The cat sat on the mat")
        >>> result.values.shape == (model.cfg.n_layers + 1, 1, model.cfg.d_vocab)
        True
        >>> result.labels[0], result.labels[-1]
        ('0_pre', 'final_post')
    """

    values: Float[Tensor, "entry batch *pos d_vocab"]
    labels: list[str]
    positions: list[int]

    def top_tokens(self, k: int = 1) -> Tensor:
        """The ids of the `k` largest logits of every entry, `values.shape[:-1] + (k,)`.

        Example:
            >>> logit_lens(model, "Hello world").top_tokens(3).shape == (model.cfg.n_layers + 1, 1, 3)
            True
        """
        k = check_int_in_range(k, "k", 1, self.values.shape[-1], "top-k sizes (up to d_vocab)", caller="top_tokens")
        return self.values.topk(k, dim=-1).indices


def readout(model: GPT, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
    """`resid` read as the model reads its last residual stream: `ln_final` (statistics of each vector
    itself), then `W_U` and `b_U`. Any leading axes; no gradient.

    Example:
        >>> logits, cache = model.run_with_cache("Hello world")
        >>> last = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
        >>> torch.allclose(readout(model, last), logits, atol=1e-4)
        True
    """
    caller = "readout"
    check_type(model, GPT, "model", "an interp_gpt GPT", caller)
    check_type(resid, Tensor, "resid", "a tensor [..., d_model]", caller)
    d_model = model.cfg.d_model
    if not resid.is_floating_point() or resid.ndim == 0 or resid.shape[-1] != d_model:
        raise ValueError(
            f"{caller}: resid has shape {tuple(resid.shape)} and dtype {resid.dtype}, expected a float tensor "
            f"[..., {d_model}] (d_model)"
        )
    W_U = model.unembed.W_U
    with torch.no_grad():
        x = resid.to(device=W_U.device, dtype=W_U.dtype)
        lead = x.shape[:-1]
        # ln_final works on [batch, pos, d_model]: the rows stand in for positions (statistics are per vector).
        x = model.ln_final(x.reshape(1, -1, d_model))
        return (x @ W_U + model.unembed.b_U).reshape(*lead, -1)


def _resid_names(model: GPT, incl_mid: bool) -> tuple[list[str], list[str]]:
    names, labels = [], []
    n = model.cfg.n_layers
    for layer in range(n):
        names.append(f"blocks.{layer}.hook_resid_pre")
        labels.append(f"{layer}_pre")
        if incl_mid:
            names.append(f"blocks.{layer}.hook_resid_mid")
            labels.append(f"{layer}_mid")
    names.append(f"blocks.{n - 1}.hook_resid_post")
    labels.append("final_post")
    return names, labels


def logit_lens(model: GPT, tokens: Any, *, positions: SliceInput = -1, incl_mid: bool = False) -> LogitLensResult:
    """The logit lens at every layer: transformer-lens 4.3's `logit_lens(model, input, positions=...)`.

    `tokens`: a string, a list of strings or token ids `[batch, pos]` (every position real).
    `positions`: which positions to read, as transformer-lens' `Slice` takes them: an int (default -1,
    the last; the pos axis is dropped), None (all), a list, a slice or a (start, stop[, step]) tuple.
    Strings of unequal lengths (in tokens) are right-padded and never read at a pad: an int position is
    read in each prompt's own tokens (-1: its last real token, as `steering.contrastive_vector` reads
    it; `.positions` then holds one per prompt), and any other selection is refused, naming the lengths.
    `incl_mid`: also read each layer's `resid_mid` (after attention, before the MLP).

    Returns a `LogitLensResult`: `.values [n_layers + 1 (+ n_layers with incl_mid), batch, (pos,) d_vocab]`,
    `.labels`, `.positions`.

    Example:
        >>> result = logit_lens(model, "The cat sat on the mat", positions=None)
        >>> result.values.shape[:2] == (model.cfg.n_layers + 1, 1)
        True
        >>> torch.allclose(result.values[-1], model("The cat sat on the mat"), atol=1e-4)
        True
    """
    caller = "logit_lens"
    check_type(model, GPT, "model", "an interp_gpt GPT", caller)
    if not isinstance(incl_mid, bool):
        raise TypeError(f"{caller}: incl_mid must be True or False, got {incl_mid!r}")
    if incl_mid and model.cfg.attn_only:
        raise ValueError(f"{caller}: incl_mid=True, but an attention-only model has no resid_mid; use incl_mid=False")
    if isinstance(tokens, Tensor):
        tokens = check_tokens(tokens, model.cfg.d_vocab, model.cfg.n_ctx, "tokens", caller=caller)
    elif not (
        isinstance(tokens, str) or (isinstance(tokens, list) and tokens and all(isinstance(s, str) for s in tokens))
    ):
        raise TypeError(
            f"{caller}: tokens must be a string, a non-empty list of strings or a tensor of token ids, "
            f"got {type(tokens).__name__}"
        )
    slice_index(positions, f"{caller}: positions")  # a bad kind of selection fails here, by name
    pos = Slice(positions)
    names, labels = _resid_names(model, incl_mid)
    mask = None
    if isinstance(tokens, list):  # right-padded: a prompt's real tokens are 0..length-1
        tokens, mask = model.to_tokens(tokens, padding_side="right", return_mask=True)
        lengths = [int(n) for n in mask.sum(1)]
        if len(set(lengths)) == 1:
            mask = None  # no pad anywhere
        elif pos.mode != "int":
            raise ValueError(
                f"{caller}: the prompts have unequal lengths {lengths} (tokens, BOS included), so positions="
                f"{positions!r} would read pads in the shorter ones; pass an int position (each prompt is then "
                "read at its own, negative counting from its own end) or prompts of one length"
            )
    with torch.no_grad():
        # stop_at_layer: the stack needs no logits of the model's own (the last entry makes them).
        _, cache = model.run_with_cache(
            tokens, attention_mask=mask, names_filter=names, stop_at_layer=model.cfg.n_layers
        )
    if mask is not None:  # unequal prompts, an int position: each read at its own, as contrastive_vector reads
        own = _own_positions(int(pos.slice), lengths, positions, caller)  # type: ignore[arg-type]
        rows = torch.arange(len(own), device=cache[names[0]].device)
        index = torch.tensor(own, device=rows.device)
        stack = torch.stack([cache[name][rows, index] for name in names])  # [entry, batch, d_model]
        return LogitLensResult(readout(model, stack), labels, own)
    n_pos = cache[names[0]].shape[1]
    picked = _positions(pos, n_pos, positions, caller)
    stack = torch.stack([pos.apply(cache[name], dim=1) for name in names])  # [entry, batch, (pos,) d_model]
    return LogitLensResult(readout(model, stack), labels, picked)


def _own_positions(index: int, lengths: list[int], given: Any, caller: str) -> list[int]:
    """Each prompt's own position `index` (negative from its own end), refusing one outside a prompt."""
    own = []
    for i, n in enumerate(lengths):
        if not -n <= index < n:
            raise ValueError(
                f"{caller}: positions={given!r} is out of range for tokens[{i}], which has {n} tokens: "
                f"0..{n - 1} (negative counts from its end)"
            )
        own.append(index % n)
    return own


def _positions(pos: Slice, n_pos: int, given: Any, caller: str) -> list[int]:
    """The positions `pos` picks from `n_pos`, refusing an index outside them (and an empty selection)."""
    if pos.mode == "int":
        index = int(pos.slice)  # type: ignore[arg-type]
        if not -n_pos <= index < n_pos:
            raise ValueError(
                f"{caller}: positions={given!r} is out of range: the prompts have {n_pos} positions, "
                f"0..{n_pos - 1} (negative counts from the end)"
            )
        return [index % n_pos]
    if pos.mode == "array":
        idx = torch.as_tensor(pos.slice)
        if idx.dtype == torch.bool:
            if idx.shape != (n_pos,):
                raise ValueError(
                    f"{caller}: positions is a mask of shape {tuple(idx.shape)}, expected ({n_pos},) (the positions)"
                )
            idx = idx.nonzero().flatten()
        bad = [int(i) for i in idx.flatten() if not -n_pos <= int(i) < n_pos]
        if bad:
            raise ValueError(
                f"{caller}: positions {bad} are out of range: the prompts have {n_pos} positions, "
                f"0..{n_pos - 1} (negative counts from the end)"
            )
        picked = [int(i) % n_pos for i in idx.flatten()]
    else:
        assert isinstance(pos.slice, slice)  # the modes left: "slice" and "identity"
        picked = list(range(n_pos))[pos.slice]
    if not picked:
        raise ValueError(f"{caller}: positions={given!r} selects none of the prompts' {n_pos} positions")
    return picked
