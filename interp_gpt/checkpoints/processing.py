"""Weight processing as transformer-lens' `from_pretrained` does it by default: fold_ln,
center_writing_weights, center_unembed, fold_value_biases (and, on request,
refactor_factored_attn_matrices). Each leaves every log-prob unchanged."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import einops
import torch
from torch import Tensor

from ..config import Config
from ..factored import FactoredMatrix

__all__ = [
    "fold_layer_norm",
    "center_writing_weights",
    "center_unembed",
    "fold_value_biases",
    "refactor_factored_attn_matrices",
    "process_weights",
    "layer_norm_weights",
]


# ----------------------------------------------------------------------------
# Weight processing (transformer-lens' defaults)
# ----------------------------------------------------------------------------
# Each step edits the tensors of `sd` in place and does its work on whatever part of the
# model `sd` holds (a layer, the embeddings, the unembedding), so that process_weights can
# take the model one part at a time and hold only that part in float64.
def _layers_in(sd: Mapping[str, Tensor], cfg: Config) -> list[int]:
    return [L for L in range(cfg.n_layers) if any(k.startswith(f"blocks.{L}.") for k in sd)]


def fold_layer_norm(
    sd: dict[str, Tensor], cfg: Config, center_weights: bool = True, *, fold_biases: bool = True
) -> None:
    """Fold each LayerNorm's weight and bias into the layer that reads its output.

    LN(x) @ W + b_W  ==  LNPre(x) @ (w[:, None] * W) + (b @ W + b_W), so after this the
    LayerNorms only centre and scale (the caller sets cfg to "LNPre"). With `center_weights`
    the reading weights are also centred along d_model: LNPre's output has zero mean, so a
    constant added along that axis changes nothing. Without `fold_biases` (transformer-lens' option
    for RMS norms) only the weights are folded and each LayerNorm's `b` stays in `sd`.
    """

    def fold(ln: str, readers: list[tuple[str, str]], d_model_axis: int) -> None:
        if f"{ln}.w" not in sd:
            return
        w, b = sd.pop(f"{ln}.w"), sd.pop(f"{ln}.b") if fold_biases else None
        shape = [1] * sd[readers[0][0]].ndim
        shape[d_model_axis] = -1
        for W_key, b_key in readers:
            W = sd[W_key]
            if b is not None:
                sd[b_key] += torch.tensordot(b, W, dims=([0], [d_model_axis]))  # b @ W along d_model
            W.mul_(w.reshape(shape))
            if center_weights:
                W.sub_(W.mean(d_model_axis, keepdim=True))

    if cfg.positional_embedding_type == "shortformer" and any(k.endswith(".w") for k in sd):
        raise ValueError(_TOY_REASONS["shortformer"].format(step="fold_layer_norm"))
    for L in _layers_in(sd, cfg):
        q = f"blocks.{L}."
        fold(q + "ln1", [(q + f"attn.W_{X}", q + f"attn.b_{X}") for X in "QKV"], d_model_axis=1)
        fold(q + "ln2", [(q + "mlp.W_in", q + "mlp.b_in")], d_model_axis=0)
    fold("ln_final", [("unembed.W_U", "unembed.b_U")], d_model_axis=0)


def center_writing_weights(sd: dict[str, Tensor], cfg: Config) -> None:
    """Make everything that writes to the residual stream write mean-zero vectors.

    Every reader of the residual stream starts with a LayerNorm that subtracts the
    mean, so removing it at the source changes no output.
    """
    if reasons := _toy_reasons(cfg):
        raise ValueError(reasons[0].format(step="center_writing_weights"))
    for key in ["embed.W_E", "pos_embed.W_pos"] + [
        f"blocks.{L}.{m}" for L in range(cfg.n_layers) for m in ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")
    ]:
        if key in sd:
            sd[key].sub_(sd[key].mean(-1, keepdim=True))


def center_unembed(sd: dict[str, Tensor]) -> None:
    """Subtract each position's mean logit (softmax is unchanged by a shift)."""
    if "unembed.W_U" in sd:
        sd["unembed.W_U"].sub_(sd["unembed.W_U"].mean(-1, keepdim=True))
        sd["unembed.b_U"].sub_(sd["unembed.b_U"].mean())


def fold_value_biases(sd: dict[str, Tensor], cfg: Config) -> None:
    """Move b_V into b_O: each pattern row sums to 1, so sum_k p_k (v_k + b_V) W_O = ... + b_V W_O."""
    for L in _layers_in(sd, cfg):
        q = f"blocks.{L}.attn."
        sd[q + "b_O"] += einops.einsum(
            sd[q + "b_V"], sd[q + "W_O"], "n_heads d_head, n_heads d_head d_model -> d_model"
        )
        sd[q + "b_V"].zero_()


def refactor_factored_attn_matrices(sd: dict[str, Tensor], cfg: Config) -> None:
    """Re-split each head's W_Q/W_K and W_V/W_O so that QK and OV (and the biases' effect) are unchanged
    but the factors are "even", as transformer-lens' method of this name does.

    QK: W_Q and W_K with their biases as an extra input row ([d_model + 1, d_head]: an input whose
    last coordinate is 1), split by the SVD of W_Q_eff W_K_eff^T = U S V^T into U sqrt(S) and
    V sqrt(S). OV: b_V is moved into b_O (each pattern row sums to 1), then W_V = U S and W_O = V^T
    from the SVD of W_V W_O, so W_O's rows are orthonormal.
    """
    for L in _layers_in(sd, cfg):
        q = f"blocks.{L}.attn."
        W_Q_eff = torch.cat([sd[q + "W_Q"], sd[q + "b_Q"][:, None, :]], dim=1)  # [n_heads, d_model + 1, d_head]
        W_K_eff = torch.cat([sd[q + "W_K"], sd[q + "b_K"][:, None, :]], dim=1)
        QK = FactoredMatrix(W_Q_eff, W_K_eff.transpose(-1, -2)).make_even()
        W_K_even = QK.B.transpose(-1, -2)
        sd[q + "W_Q"], sd[q + "b_Q"] = QK.A[:, :-1, :], QK.A[:, -1, :]
        sd[q + "W_K"], sd[q + "b_K"] = W_K_even[:, :-1, :], W_K_even[:, -1, :]

        sd[q + "b_O"] = sd[q + "b_O"] + einops.einsum(
            sd[q + "b_V"], sd[q + "W_O"], "n_heads d_head, n_heads d_head d_model -> d_model"
        )
        sd[q + "b_V"] = torch.zeros_like(sd[q + "b_V"])
        U, S, V = FactoredMatrix(sd[q + "W_V"], sd[q + "W_O"]).svd()
        sd[q + "W_V"], sd[q + "W_O"] = U * S[..., None, :], V.transpose(-1, -2)


# process_weights' flags share these functions' names.
_center_writing_weights, _center_unembed, _fold_value_biases = center_writing_weights, center_unembed, fold_value_biases


def process_weights(
    sd: dict[str, Tensor],
    cfg: Config,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
    *,
    inplace: bool = False,
) -> dict[str, Tensor]:
    """Apply transformer-lens' default processing, in its order, computing in float64.

    Works on the dict `sd` in place and returns it. One piece of the model at a time (a
    layer; 4,096 rows of W_E; 4,096 columns of W_U with ln_final) is copied to float64 and
    processed, so no more than a layer's float64 copy exists at once (for GPT-2 small 57 MB,
    not the 309 MB of its unembedding); every step acts on each row, column or layer alone,
    so this equals running each step over the whole model in turn. The one exception,
    center_unembed's mean over the vocabulary, is summed in a first pass over W_U. The
    results replace the dict's entries in their own dtype, or with `inplace=True` are
    written into the tensors `sd` holds (no new memory; only for tensors that are the
    caller's to change, as from_pretrained's are). With every flag off it changes nothing.
    Toy models (normalization_type=None, shortformer positions) skip, with a warning, the
    steps that would change their outputs, as transformer-lens does (see _skip_for_toy_models).
    """
    if not (fold_ln or center_writing_weights or center_unembed or fold_value_biases):
        return sd
    fold_ln, center_writing_weights, center_unembed = _skip_for_toy_models(
        cfg, fold_ln, center_writing_weights, center_unembed
    )
    fold = fold_ln and cfg.normalization_type == "LN"

    pieces, unembed_pieces = _pieces(sd, cfg.n_layers)

    # One float64 buffer, the size of the largest piece, holds each piece in turn: fresh memory
    # is paid for once, not once per piece (on a VM, first-touching a page is what costs).
    scratch = torch.empty(
        max(sum(sd[k][i].numel() for k, i in p) for p in pieces + unembed_pieces), dtype=torch.float64
    )

    def processed(piece: _Piece) -> dict[str, Tensor]:
        part, used = {}, 0
        for k, i in piece:
            src = sd[k][i]
            part[k] = scratch[used : used + src.numel()].view(src.shape).copy_(src)
            used += src.numel()
        if fold:
            fold_layer_norm(part, cfg)
        if center_writing_weights:
            _center_writing_weights(part, cfg)
        if fold_value_biases:
            _fold_value_biases(part, cfg)
        return part

    results: dict[str, Tensor] = {}  # inplace=False: the new tensors, filled piece by piece
    folded: set[str] = set()

    def store(piece: _Piece, part: dict[str, Tensor]) -> None:
        for k, i in piece:
            if k not in part:  # a LayerNorm folded away
                folded.add(k)
                continue
            if not inplace and k not in results:
                results[k] = torch.empty_like(sd[k])
            (sd[k] if inplace else results[k])[i].copy_(part[k])

    for piece in pieces:
        part = processed(piece)
        if center_unembed:  # an unembedding that came whole
            _center_unembed(part)
        store(piece, part)
    if unembed_pieces:
        means = _vocab_means(sd, unembed_pieces, processed) if center_unembed else None
        for piece in unembed_pieces:
            part = processed(piece)
            if means is not None:
                mean_W, mean_b = means
                part["unembed.W_U"].sub_(mean_W[:, None])
                part["unembed.b_U"].sub_(mean_b)
            store(piece, part)
    for k in folded:
        del sd[k]
    sd.update(results)
    if fold:
        cfg.normalization_type = "LNPre"
    return sd


# A piece: (key, index) pairs, where index picks the rows or columns of sd[key] it holds.
_Piece = list[tuple[str, tuple[slice, ...]]]


def _pieces(sd: dict[str, Tensor], n_layers: int) -> tuple[list[_Piece], list[_Piece]]:
    """What process_weights processes one at a time: each layer, pos_embed, chunks of W_E's rows
    and the rest (ln_final, unembed) whole; or, where sd has W_U and b_U, the unembedding pieces
    (second list): chunks of its columns, each with the rest (ln_final)."""
    whole = (slice(None),)
    chunk = _PROCESS_CHUNK
    pieces: list[_Piece] = [[(k, whole) for k in sd if k.startswith(f"blocks.{L}.")] for L in range(n_layers)]
    pieces.append([(k, whole) for k in sd if k.startswith("pos_embed.")])
    if "embed.W_E" in sd:
        pieces += [[("embed.W_E", (slice(i, i + chunk),))] for i in range(0, sd["embed.W_E"].shape[0], chunk)]
    rest = [k for k in sd if not k.startswith(("blocks.", "embed.", "pos_embed."))]  # ln_final, unembed
    unembed_pieces: list[_Piece] = []
    if "unembed.W_U" in sd and "unembed.b_U" in sd:
        others = [(k, whole) for k in rest if k not in ("unembed.W_U", "unembed.b_U")]
        for i in range(0, sd["unembed.W_U"].shape[1], chunk):
            cols = slice(i, i + chunk)
            unembed_pieces.append(others + [("unembed.W_U", (slice(None), cols)), ("unembed.b_U", (cols,))])
    elif rest:
        pieces.append([(k, whole) for k in rest])
    return pieces, unembed_pieces


def _vocab_means(
    sd: dict[str, Tensor], unembed_pieces: list[_Piece], processed: Callable[[_Piece], dict[str, Tensor]]
) -> tuple[Tensor, Tensor]:
    """center_unembed's first pass: the mean over the vocabulary of the processed W_U and b_U."""
    sum_W = torch.zeros(sd["unembed.W_U"].shape[0], dtype=torch.float64)
    sum_b = torch.zeros((), dtype=torch.float64)
    for piece in unembed_pieces:
        part = processed(piece)
        sum_W += part["unembed.W_U"].sum(-1)
        sum_b += part["unembed.b_U"].sum()
    return sum_W / sd["unembed.W_U"].shape[1], sum_b / sd["unembed.b_U"].shape[0]


def layer_norm_weights(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Copies (float32, on the CPU) of the LayerNorm weights and biases in `sd`, the ones fold_ln takes
    away. A processed model keeps them as `folded_layer_norms`, so that what was computed on its raw
    weights (a transcoder reading ln2.hook_normalized) converts to it exactly."""
    norms = (".ln1.w", ".ln1.b", ".ln2.w", ".ln2.b")
    return {
        k: v.detach().to("cpu", torch.float32, copy=True)
        for k, v in sd.items()
        if k.endswith(norms) or k in ("ln_final.w", "ln_final.b")
    }


# process_weights holds this many rows of W_E, or columns of W_U, in float64 at once.
_PROCESS_CHUNK = 4096


# Why a step would change a toy model's outputs (transformer-lens skips these steps there too).
_TOY_REASONS = {
    "norm": "{step}: with normalization_type=None nothing centres the residual stream, so centring what "
    "writes to it would change the model's outputs (and there is no LayerNorm to fold)",
    "shortformer": "{step}: with positional_embedding_type='shortformer' W_pos is added to the queries' and "
    "keys' inputs after ln1, so folding ln1 or centring W_pos would change the model's outputs",
}


def _toy_reasons(cfg: Config) -> list[str]:
    return [
        _TOY_REASONS[k]
        for k, on in (
            ("norm", cfg.normalization_type is None),
            ("shortformer", cfg.positional_embedding_type == "shortformer"),
        )
        if on
    ]


def _skip_for_toy_models(cfg: Config, fold_ln: bool, center_writing: bool, center_unembed: bool) -> tuple[bool, ...]:
    """The flags process_weights keeps for `cfg`, as transformer-lens does: with normalization_type=None
    it skips fold_ln and center_writing_weights, and its from_pretrained skips fold_ln,
    center_writing_weights and center_unembed for a shortformer model. A warning names what was skipped."""
    norm_none = cfg.normalization_type is None
    short = cfg.positional_embedding_type == "shortformer"
    keep = {
        "fold_ln": fold_ln and not (norm_none or short),
        "center_writing_weights": center_writing and not (norm_none or short),
        "center_unembed": center_unembed and not short,
    }
    asked = {"fold_ln": fold_ln, "center_writing_weights": center_writing, "center_unembed": center_unembed}
    skipped = [k for k in keep if asked[k] and not keep[k]]
    if skipped:
        what = " and ".join(
            f
            for f, on in (("normalization_type=None", norm_none), ("positional_embedding_type='shortformer'", short))
            if on
        )
        warnings.warn(
            f"process_weights: skipped {', '.join(skipped)} for a model with {what}, "
            "as transformer-lens does (see interp_gpt.processing._TOY_REASONS)",
            stacklevel=3,
        )
    return keep["fold_ln"], keep["center_writing_weights"], keep["center_unembed"]
