"""The checks every attribution entry point shares (`attribute`, `qk_attribution`, `feature_intervention`,
`feature_intervention_generate`), run once where its inputs enter, each naming its caller.

- The model and the prompt come in through the one way in the analysis packages share
  (`interp_gpt.prepare`): an interp_gpt GPT with no module spliced in, and one prompt's token ids with a
  BOS first (see `prepare.prompt_tokens`).
- The transcoders (`check_transcoders`): one per layer (or a cross-layer transcoder), each reading the
  MLP's input and writing its output, converted to the model's weights, as the `Readers` every phase
  reads them through.

A spliced module is refused whether or not it has its error term: the replacement model is built from
hooks on the unchanged model (its gradients would pass through a spliced module's reconstruction only,
and what the hooks read would be the module's output), and the interventions splice the transcoders
they are given themselves.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import Tensor

from ..model.gpt import GPT
from ..prepare import checked_model, prompt_tokens
from ..sae.transcoders.clt import CrossLayerTranscoder
from ..sae.transcoders.transcoder import Transcoder, converted_with, fit_plan
from .replacement import Readers

__all__: list[str] = []

SPLICED_WHY = (
    "the attribution tools build the local replacement model from hooks on the unchanged model and splice "
    "the transcoders they are given themselves, so a module spliced in beforehand changes what those hooks "
    "read and where the gradients flow (the graph would be wrong, not refused): take it out with "
    "model.reset_saes()"
)


def prepare(model: Any, prompt: Any, transcoders: Any, caller: str) -> tuple[GPT, Tensor, Readers]:
    """The checked model, the prompt's token ids `[pos]` (BOS first) and the transcoders as `Readers`.

    Example:
        >>> model, tokens, readers = prepare(model, "The cat sat", transcoders, "attribute")
    """
    model = checked_model(model, caller, splices="none", why=SPLICED_WHY)
    tokens = prompt_tokens(model, prompt, caller)
    readers = check_transcoders(model, transcoders, caller)
    return model, tokens, readers


def in_model_dtype(model: GPT, readers: Readers) -> Readers:
    """`readers` with its transcoders in the model's dtype and on its device, to be spliced into the model
    (a splice takes only a module of the model's dtype): copies where they differ (the caller's transcoders
    are never changed), as `attribute` reads float32 transcoders on a float64 or bfloat16 model.

    Example:
        >>> in_model_dtype(model_in_float64, readers).dtype
        torch.float64
    """
    dtype, device = model.W_E.dtype, model.W_E.device
    modules: list[Transcoder | CrossLayerTranscoder] = []
    modules += readers.plts if readers.plts is not None else [readers.clt] if readers.clt is not None else []
    if all(m.dtype == dtype and m.device == device for m in modules):
        return readers
    moved = [copy.deepcopy(m).to(device=device, dtype=dtype) for m in modules]
    return Readers(moved if readers.plts is not None else moved[0], readers.n_layers)  # type: ignore[arg-type]


def bos_positions(model: GPT) -> slice:
    """The positions whose features and error vectors are no node's value: position 0 where it is a BOS
    (with a tokenizer `prompt_tokens` puts one first unless the prompt starts with a special token), none
    without a tokenizer (no BOS is put first, so position 0 is the prompt's own first token).

    Example:
        >>> bos_positions(GPT.from_pretrained("tiny-gpt2"))
        slice(0, 1, None)
    """
    return slice(0, 1) if getattr(model, "tokenizer", None) is not None else slice(0, 0)


def check_transcoders(model: GPT, transcoders: Any, caller: str) -> Readers:
    """One transcoder per layer, each fitting its layer (converted to the model's weights), or a CLT."""
    n, d = model.cfg.n_layers, model.cfg.d_model
    if isinstance(transcoders, CrossLayerTranscoder):
        if transcoders.n_layers != n:
            raise ValueError(f"{caller}: transcoders: a CLT over {transcoders.n_layers} layers; the model has {n}")
        clt = transcoders.converted_to(model, copy=False)
        for layer in range(n):
            _check_hooks(clt.input_hook(layer), clt.output_hook(layer), layer, f"the CLT's layer {layer}", caller)
        if clt.cfg.d_in != d or clt.cfg.d_out != d:
            raise ValueError(
                f"{caller}: transcoders: the CLT reads {clt.cfg.d_in} and writes {clt.cfg.d_out} wide; "
                f"the model's MLP input and output are d_model={d}"
            )
        return Readers(clt, n)
    if isinstance(transcoders, Transcoder):
        transcoders = [transcoders]
    if not isinstance(transcoders, (list, tuple)) or not all(isinstance(t, Transcoder) for t in transcoders):
        raise TypeError(
            f"{caller}: transcoders: expected a list of Transcoder (one per layer) or a CrossLayerTranscoder, "
            f"got {type(transcoders).__name__}"
        )
    by_layer: dict[int, Transcoder] = {}
    plans: dict[int, Any] = {}
    for i, tc in enumerate(transcoders):
        arg = f"transcoders[{i}]"
        plan = fit_plan(model, tc, caller=caller, arg=arg)  # check_transcoder_fits' checks, and the map
        if tc.layer is None:
            raise ValueError(f"{caller}: {arg}: its hooks {tc.input_hook!r}, {tc.output_hook!r} name no layer")
        if tc.layer in by_layer:
            raise ValueError(f"{caller}: {arg}: a second transcoder for layer {tc.layer}")
        for field, width in (("d_in", tc.d_in), ("d_out", tc.d_out)):
            if width != d:
                raise ValueError(f"{caller}: {arg}: {field}={width} does not fit the model's MLP, d_model={d}")
        by_layer[tc.layer], plans[tc.layer] = tc, plan
    missing = [layer for layer in range(n) if layer not in by_layer]
    if missing:
        raise ValueError(
            f"{caller}: transcoders: none for layers {missing}; the replacement model needs one for every layer 0..{n - 1}"
        )
    converted = [converted_with(by_layer[layer], model, plans[layer], copy=False) for layer in range(n)]
    for layer, tc in enumerate(converted):
        _check_hooks(tc.input_hook, tc.output_hook, layer, f"the transcoder of layer {layer}", caller)
    return Readers(converted, n)


def _check_hooks(read: str | None, write: str | None, layer: int, what: str, caller: str) -> None:
    if write != f"blocks.{layer}.hook_mlp_out":
        raise ValueError(f"{caller}: {what} writes {write!r}; attribution replaces MLPs: blocks.{layer}.hook_mlp_out")
    ok = ("ln2.hook_normalized", "hook_resid_mid")
    if read not in [f"blocks.{layer}.{h}" for h in ok]:
        raise ValueError(
            f"{caller}: {what} reads {read!r}; attribution reads the MLP's input at blocks.{layer}.{ok[0]} "
            f"or blocks.{layer}.{ok[1]}"
        )
