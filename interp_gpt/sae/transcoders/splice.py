"""A `CrossLayerTranscoder` spliced into a model, through the one mechanism (interp_gpt.model.splicing): as one
view per layer, each a module with the splicing protocol.

View l reads `clt.input_hook(l)` (mapped onto the model's weights as a per-layer transcoder's is: see
transcoder_processing) and replaces `clt.output_hook(l)` with

    y_l = b_dec[l] + sum_{s <= l} f_s @ W_dec[s][:, l - s]  (+ x_l @ W_skip[l].T)

where f_s are layer s's features of the same pass. Each layer's features are computed once, by view s at
layer s's write hook, through the CLT's hook points `layers.{s}.hook_sae_*` (spliced, they are
`blocks.{s}.hook_mlp_out.hook_sae_*`), and kept in the pass's shared dict (the views share the CLT as
their `splice_state`: per thread, per pass, dropped at the pass's end and on error) for the views of the
later layers, which decode from them as hooked: zeroing a layer-0 feature at
`blocks.0.hook_mlp_out.hook_sae_acts_post` takes its decoders out of every later layer. The error term's
clean pass (`hooked=False`) decodes from each layer's clean features (those a hook-free pass computes).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from ...hooks import HookPoint
from .processing import Plan, apply_input, apply_output

if TYPE_CHECKING:
    from .clt import CrossLayerTranscoder

__all__ = ["CLTLayer"]

_INNER = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons")
_NAMES = _INNER + ("hook_sae_error", "hook_sae_output")


class CLTLayer:
    """Layer `layer` of `clt` as the splicing mechanism sees it (what `clt.splice_parts()` returns). Its
    hook points are the CLT's `layers.{layer}.*`; `cfg`, `W_enc`, `W_skip` ... are that layer's, so the
    per-layer transcoder's checks (model name, layer, hooks, widths, weight processing) apply to it."""

    hook_names = _NAMES

    def __init__(self, clt: CrossLayerTranscoder, layer: int) -> None:
        self.clt, self.layer = clt, layer
        self._splice_plan: Plan | None = None

    # ----- what the per-layer checks read (as a Transcoder's) --------------------------------------
    @property
    def cfg(self) -> Any:
        return self.clt.cfg

    @property
    def input_hook(self) -> str | None:
        return self.clt.input_hook(self.layer)

    @property
    def output_hook(self) -> str | None:
        return self.clt.output_hook(self.layer)

    @property
    def d_in(self) -> int:
        return self.clt.cfg.d_in

    @property
    def d_out(self) -> int:
        return self.clt.cfg.d_out

    @property
    def W_enc(self) -> Tensor:
        return self.clt.W_enc[self.layer]

    @property
    def W_skip(self) -> Tensor:
        return self.clt.W_skip[self.layer]

    # ----- the protocol -----------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in _NAMES:
            return getattr(self.clt.layers[self.layer], name)
        if name in ("dtype", "device"):  # the CLT's
            return getattr(self.clt, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    hook_sae_error: HookPoint
    hook_sae_output: HookPoint
    dtype: torch.dtype
    device: torch.device

    @property
    def splice_state(self) -> object:
        """The views of one CLT share one dict per pass: each layer's features."""
        return self.clt

    def splice_has_hooks(self) -> bool:
        """A hook on layer s <= l's points can change layer l's output (its features decode into l)."""
        return any(getattr(self.clt.layers[s], n).has_hooks for s in range(self.layer + 1) for n in _INNER)

    def splice_hooks(self, model: Any, arg: str = "sae") -> tuple[str, str]:
        """(read, write) of this layer, once it fits `model`, as `Transcoder.splice_hooks` (the same checks
        and the same exact map onto the model's weights, or a refusal naming the layer and why)."""
        from .transcoder import fit_plan, take_splice_plan

        plan = fit_plan(model, cast(Any, self), caller="splice", arg=f"{arg} (a CrossLayerTranscoder)")
        if self.input_hook is None or self.output_hook is None:
            raise ValueError(
                f"{arg}: the CrossLayerTranscoder's cfg.metadata.hook_name (the input) and hook_name_out (the "
                f"output) must both be set to splice it, got {self.cfg.metadata.get('hook_name')!r} and "
                f"{self.cfg.metadata.get('hook_name_out')!r}"
            )
        return take_splice_plan(self, model, plan)

    def splice_forward(self, x: Tensor, hooked: bool = True, state: dict[Any, Any] | None = None) -> Tensor:
        """Layer l's prediction from its read activation `x` and the features of layers 0..l-1 kept in
        this pass's `state`; this layer's features are kept there for the later layers. `hooked=False`:
        past every hook point, from the clean features (the error term's clean pass)."""
        if state is None:
            raise ValueError(
                f"CLTLayer.splice_forward: layer {self.layer} of a CrossLayerTranscoder decodes the features of "
                "the layers before it in the same pass: splice the CLT (model.transcoders(clt)), do not call this"
            )
        clt, layer, plan = self.clt, self.layer, self._splice_plan
        if layer == 0 and hooked:  # a new pass (a pass past model(...) shares the bottom frame)
            state.clear()
        x_in = apply_input(x, plan)
        acts = clt._encode(x_in, layer, hooked)
        state.setdefault("acts" if hooked else "clean", {})[layer] = acts
        kept, clean = state.get("acts", {}), state.get("clean", {})
        seq = []
        for s in range(layer):
            # the clean features of layer s where a hook changed its own (else its features are clean)
            a = kept.get(s) if hooked or s not in clean else clean[s]
            if a is None:
                raise ValueError(
                    f"the CrossLayerTranscoder's layer {layer} (at {self.output_hook!r}) decodes layer {s}'s features, "
                    f"but layer {s}'s view of it did not run in this pass (taken out by reset_saes?): splice the whole "
                    "CLT (model.transcoders(clt)), or take out all of its layers"
                )
            seq.append(a)
        seq.append(acts)
        return apply_output(clt._decode(seq, layer, x_in if clt.cfg.skip else None, hooked), plan)

    def extra_repr(self) -> str:
        return f"layer {self.layer} of CrossLayerTranscoder({self.clt.extra_repr()})"

    def __repr__(self) -> str:
        return f"CLTLayer({self.extra_repr()})"

    # a copy of the CLT gets views of its own, spliced nowhere
    def __deepcopy__(self, memo: dict[int, Any]) -> CLTLayer:
        return CLTLayer(copy.deepcopy(self.clt, memo), self.layer)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CLTLayer, (self.clt, self.layer))
