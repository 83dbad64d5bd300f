"""A transcoder made for one kind of weights used on the other: converted exactly, or refused by name.

circuit-tracer (and sae-lens' GPT-2 transcoders) work on raw weights; `GPT.from_pretrained` processes
them as transformer-lens does. At layer L (fold_value_biases, center_unembed and
refactor_factored_attn_matrices change none of these hooks: attn_out is unchanged, the logits shift):

- `ln2.hook_normalized` is x_hat = (x - mean) / std on raw and processed weights alike (transformer-lens
  hooks it before w and b): a transcoder reading it needs no conversion.
- fold_ln moves ln2's w and b into W_in / b_in, so the MLP's input (circuit-tracer's and transformer-lens
  4's `mlp.hook_in`) is x_hat * w + b on raw weights and x_hat on processed ones. A transcoder reading
  the raw MLP input y = x_hat * w + b reads ln2.hook_normalized as W_enc' = diag(w) W_enc,
  b_enc' = b_enc + b @ W_enc, W_skip' = W_skip diag(w), b_dec' = b_dec + W_skip b (the same
  pre-activations); w and b are the model's own, or, where fold_ln took them, `model.folded_layer_norms`.
- center_writing_weights makes every writer to the residual stream write mean-zero vectors, so
  `hook_mlp_out` and `hook_resid_mid` are the raw ones less their mean over d_model (C = I - 11^T/d).
  Output, raw -> processed: W_dec' = W_dec C, b_dec' = C b_dec, W_skip' = C W_skip predict C y exactly.
  Processed -> raw: refused (the raw output's mean is a function of the MLP's hidden activations, which
  the transcoder does not predict). Input resid_mid, processed -> raw: W_enc' = C W_enc, W_skip' = W_skip C
  (reading C r; exact as long as what it reads on processed weights is centred, which a transcoder
  spliced upstream without the error term keeps only if its prediction is); raw -> processed: exact
  only where the encoder and the skip ignore the all-ones direction (1^T W_enc = 0), as the mean the
  model removed is gone; else refused.

What a transcoder is for is `cfg.metadata.model_processing` (`{"fold_ln", "center_writing_weights"}`,
raw where a file does not say); what a model is is read from it: fold_ln where
`cfg.normalization_type == "LNPre"`, centring where layer L's W_out and b_out (and, for resid_mid,
every writer before it) are mean-zero over d_model. A model whose cfg says "LN" is taken to hold its
checkpoint's own LayerNorm weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ...checks import is_centred
from .config import PROCESSING_KEY

__all__ = [
    "KNOWN_INPUTS",
    "Plan",
    "model_processing",
    "conversion_plan",
    "convert_state",
    "apply_input",
    "apply_output",
]

_LOAD_RAW = "GPT.from_pretrained_no_processing(...)"
# The input hooks a conversion is known for (relative to blocks.L). mlp.hook_in is the MLP's input
# (circuit-tracer's and transformer-lens 4's name): ln2's output, x_hat * w + b on raw weights.
KNOWN_INPUTS = ("ln2.hook_normalized", "mlp.hook_in", "hook_resid_mid")
_LOAD_PROCESSED = "GPT.from_pretrained(...)"


@dataclass
class Plan:
    """How a transcoder's numbers map onto one layer of a model: its input is `x * scale + shift`
    (ln2.hook_normalized) or `x - mean(x)` (`in_centre`, hook_resid_mid) of the model's, and the
    model's output is its prediction less its mean (`out_centre`). `processing` is the model's: what a
    converted transcoder records."""

    processing: dict[str, bool]
    read_hook: str | None = None  # the model hook it reads (mlp.hook_in: ln2.hook_normalized)
    scale: Tensor | None = None  # [d_in], float64
    shift: Tensor | None = None  # [d_in], float64
    in_centre: bool = False
    out_centre: bool = False

    @property
    def identity(self) -> bool:
        """Nothing to map: its numbers are the model's as they are."""
        return self.scale is None and not self.in_centre and not self.out_centre


def _mlp_out_centred(model: Any, layer: int) -> bool:
    mlp = model.blocks[layer].mlp
    return is_centred(mlp.b_out) and is_centred(mlp.W_out)  # the small one first: often enough to say no


def _resid_mid_centred(model: Any, layer: int) -> bool:
    """Every writer before blocks.{layer}.hook_resid_mid writes mean-zero vectors."""
    writers = [model.embed.W_E, model.pos_embed.W_pos]
    for i in range(layer + 1):
        attn = model.blocks[i].attn
        writers += [attn.W_O, attn.b_O]
        if i < layer:
            writers += [model.blocks[i].mlp.W_out, model.blocks[i].mlp.b_out]
    return all(is_centred(w) for w in writers)


def model_processing(model: Any, layer: int = 0) -> dict[str, bool]:
    """The weight processing of `model` as a transcoder of layer `layer` sees it:
    {"fold_ln": its LayerNorms are folded, "center_writing_weights": layer's hook_mlp_out is centred}.
    Record it as a transcoder's `cfg.metadata.model_processing` when training one on `model`.

    Example:
        >>> model_processing(GPT.from_pretrained("tiny-gpt2"), 1)
        {'fold_ln': True, 'center_writing_weights': True}
    """
    return {
        "fold_ln": model.cfg.normalization_type == "LNPre",
        "center_writing_weights": model.cfg.normalization_type is not None and _mlp_out_centred(model, layer),
    }


def _raw_ln2(model: Any, layer: int, where: str, hook: str) -> tuple[Tensor, Tensor] | None:
    """The checkpoint's ln2 (w, b) in float64: the model's own if it still has them, else those fold_ln
    recorded (model.folded_layer_norms); None where the model has no LayerNorm weights at all."""
    cfg = model.cfg
    if cfg.normalization_type == "LN":
        ln = model.blocks[layer].ln2
        return ln.w.detach().double(), ln.b.detach().double()
    if cfg.normalization_type is None:
        return None
    folded = getattr(model, "folded_layer_norms", None) or {}
    w, b = folded.get(f"blocks.{layer}.ln2.w"), folded.get(f"blocks.{layer}.ln2.b")
    if w is None or b is None:
        raise ValueError(
            f"{where}: {hook}: the transcoder was made for raw weights, where the MLP's input is ln2's output "
            "x_hat * w + b; this model's LayerNorms are folded (cfg.normalization_type='LNPre') and it does not "
            f"record the w and b fold_ln took away (model.folded_layer_norms, which {_LOAD_PROCESSED} keeps): "
            f"load the model with {_LOAD_PROCESSED} or {_LOAD_RAW}"
        )
    return w.double(), b.double()


def conversion_plan(
    processing: dict[str, bool],
    input_hook: str | None,
    output_hook: str | None,
    layer: int,
    W_enc: Tensor,
    W_skip: Tensor | None,
    model: Any,
    where: str,
) -> Plan:
    """The exact map from a transcoder made for `processing` onto layer `layer` of `model`, or a
    ValueError naming the hook and why none exists. `W_enc` [d_in, d_sae] and `W_skip` [d_out, d_in]
    are needed only to tell whether a raw transcoder reading hook_resid_mid ignores the mean."""
    mine = model_processing(model, layer)
    plan = Plan(processing=mine, read_hook=input_hook)
    rel_in = input_hook.split(".", 2)[-1] if input_hook else None
    rel_out = output_hook.split(".", 2)[-1] if output_hook else None
    if (rel_in is not None and rel_in not in KNOWN_INPUTS) or (rel_out is not None and rel_out != "hook_mlp_out"):
        if processing != mine:
            other = rel_in if rel_in not in KNOWN_INPUTS else rel_out
            raise ValueError(
                f"{where}: its metadata.{PROCESSING_KEY} is {processing} but the model's is {mine}, and no exact "
                f"conversion is known for a transcoder at {other!r} (only at {', '.join(KNOWN_INPUTS)} and "
                "hook_mlp_out): load the model the way the transcoder was made"
            )
        return plan
    # Output: hook_mlp_out, raw or centred.
    tc_centred, model_out_centred = processing["center_writing_weights"], mine["center_writing_weights"]
    if rel_out is not None and tc_centred and not model_out_centred:
        raise ValueError(
            f"{where}: {output_hook}: the transcoder was made for centred writing weights (metadata.{PROCESSING_KEY}."
            "center_writing_weights=True), where hook_mlp_out has mean 0 over d_model; this model's has not, and "
            "that mean (a function of the MLP's hidden activations) is nothing the transcoder predicts: load the "
            f"model with {_LOAD_PROCESSED}"
        )
    plan.out_centre = rel_out is not None and not tc_centred and model_out_centred
    if rel_in == "mlp.hook_in":  # the MLP's input, read through ln2.hook_normalized (x_hat on any weights)
        plan.read_hook = f"blocks.{layer}.ln2.hook_normalized"
        affine = None if processing["fold_ln"] else _raw_ln2(model, layer, where, str(input_hook))
        if affine is not None:
            plan.scale, plan.shift = affine
    elif rel_in == "hook_resid_mid":
        model_in_centred = model.cfg.normalization_type is not None and _resid_mid_centred(model, layer)
        if tc_centred and not model_in_centred:
            plan.in_centre = True  # it read C r: read r through C
        elif model_in_centred and not tc_centred:
            _check_ignores_mean(W_enc, W_skip, plan.out_centre, where, str(input_hook))
    return plan


def _check_ignores_mean(W_enc: Tensor, W_skip: Tensor | None, out_centre: bool, where: str, hook: str) -> None:
    """A raw transcoder reading resid_mid gives the same numbers on the centred stream only if its
    encoder's columns (and its skip's rows, as the output is taken) sum to 0 over d_in."""
    parts = [("its encoder (W_enc's columns)", W_enc, 0)]
    if W_skip is not None:
        skip = W_skip.double() - W_skip.double().mean(0, keepdim=True) if out_centre else W_skip
        parts.append(("its skip (W_skip's rows)", skip, 1))
    for what, t, dim in parts:
        if not is_centred(t, dim):
            raise ValueError(
                f"{where}: {hook}: the transcoder was made for raw weights, but this model's center_writing_weights "
                f"took the mean over d_model out of hook_resid_mid, and {what} reads that mean (it does not sum to 0 "
                f"over d_in), so no transcoder on this model computes the same features: load the model with "
                f"{_LOAD_RAW} (or GPT.from_pretrained(..., center_writing_weights=False))"
            )


# ----------------------------------------------------------------------------------------------
# Applying a plan: to the weights (a converted transcoder), or to the activations (a splice)
# ----------------------------------------------------------------------------------------------
def convert_state(state: dict[str, Tensor], plan: Plan) -> dict[str, Tensor]:
    """The tensors of the converted transcoder (sae-lens' names and layout), computed in float64 and
    stored in each tensor's own dtype; the thresholds are unchanged (the pre-activations are)."""
    out = {k: v.detach().double() for k, v in state.items()}
    W_enc, b_dec, skip = out["W_enc"], out["b_dec"], out.get("W_skip")
    if plan.scale is not None and plan.shift is not None:
        scale, shift = plan.scale.to(W_enc.device), plan.shift.to(W_enc.device)
        out["b_enc"] = out["b_enc"] + shift @ W_enc
        out["W_enc"] = W_enc = scale[:, None] * W_enc
        if skip is not None:
            b_dec = out["b_dec"] = b_dec + skip @ shift
            out["W_skip"] = skip = skip * scale[None, :]
    if plan.in_centre:
        out["W_enc"] = W_enc - W_enc.mean(0, keepdim=True)
        if skip is not None:
            out["W_skip"] = skip = skip - skip.mean(1, keepdim=True)
    if plan.out_centre:
        out["W_dec"] = out["W_dec"] - out["W_dec"].mean(-1, keepdim=True)
        out["b_dec"] = b_dec - b_dec.mean()
        if skip is not None:
            out["W_skip"] = skip - skip.mean(0, keepdim=True)
    return {k: v.to(state[k].dtype) for k, v in out.items()}


def apply_input(x: Tensor, plan: Plan | None) -> Tensor:
    """The model's read activation as the transcoder reads it (a splice's way: no weights copied)."""
    if plan is None:
        return x
    if plan.scale is not None and plan.shift is not None:
        x = x * plan.scale.to(x.device, x.dtype) + plan.shift.to(x.device, x.dtype)
    if plan.in_centre:
        x = x - x.mean(-1, keepdim=True)
    return x


def apply_output(y: Tensor, plan: Plan | None) -> Tensor:
    """The transcoder's prediction as the model's output hook holds it."""
    if plan is not None and plan.out_centre:
        y = y - y.mean(-1, keepdim=True)
    return y


# ----------------------------------------------------------------------------------------------
# Cross-layer transcoders: the same maths, layer by layer
# ----------------------------------------------------------------------------------------------
def clt_plans(clt: Any, model: Any, caller: str) -> list[Plan]:
    """One plan per layer of a CrossLayerTranscoder (its encoder l reads layer l, its decoders into
    layer m write layer m), each refused by name as a PLT's would be."""
    c = clt.cfg
    if c.n_layers > model.cfg.n_layers:
        raise ValueError(f"{caller}: the CLT has {c.n_layers} layers but the model {model.cfg.n_layers}")
    plans = []
    for layer in range(c.n_layers):
        skip = clt.W_skip[layer] if c.skip else None
        where = f"{caller}: the CLT's layer {layer}"
        hooks = (c.metadata.get("hook_name"), c.metadata.get("hook_name_out"))
        full = [
            None if h is None else (h.format(layer=layer) if "{layer}" in h else f"blocks.{layer}.{h}") for h in hooks
        ]
        plans.append(conversion_plan(c.processing, full[0], full[1], layer, clt.W_enc[layer], skip, model, where))
    kinds = {tuple(p.processing.values()) for p in plans}
    if len(kinds) > 1:
        raise ValueError(
            f"{caller}: the model's layers are processed differently ({[p.processing for p in plans]}); "
            "a CLT records one metadata.model_processing"
        )
    return plans


def convert_clt_state(state: dict[str, Tensor], plans: list[Plan], skip: bool) -> dict[str, Tensor]:
    """A CLT's tensors (W_enc [n, d_in, d_sae], b_enc, b_dec, W_skip [n, d_out, d_in], W_dec.{s}
    [d_sae, n - s, d_out]) converted layer by layer as convert_state converts a PLT's."""
    out = dict(state)
    layers = []
    for i, plan in enumerate(plans):
        one = {"W_enc": state["W_enc"][i], "b_enc": state["b_enc"][i], "b_dec": state["b_dec"][i]}
        one["W_dec"] = state["b_dec"][i][None, :]  # a stand-in: the decoders are centred below
        if skip:
            one["W_skip"] = state["W_skip"][i]
        layers.append(convert_state(one, plan))
    for name in ("W_enc", "b_enc", "b_dec") + (("W_skip",) if skip else ()):
        out[name] = torch.stack([layer[name] for layer in layers])
    for s in range(len(plans)):
        W = state[f"W_dec.{s}"].double()
        centre = torch.tensor([plans[s + j].out_centre for j in range(W.shape[1])], device=W.device)
        W = torch.where(centre[None, :, None], W - W.mean(-1, keepdim=True), W)
        out[f"W_dec.{s}"] = W.to(state[f"W_dec.{s}"].dtype)
    return out
