"""GPT-2's side of the hook machinery: the opt-in hook points (each behind a `Config` flag, as in
transformer-lens), their errors, a `run_with_cache` that stops after the last cached layer, and the
model's place (`cfg.device`, `cfg.dtype`) kept in step with its weights.
`HookedGPT` is `HookedModule` (hooks.py) with these; `GPT` is built on it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from ..hooks import HookedModule

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["HookedGPT"]


# Opt-in hook points exist only while their Config flag is on (as in transformer-lens);
# asking for one while it is off gives an error that names the flag.
_OPT_IN_HOOKS = {
    "attn.hook_result": "use_attn_result",
    "hook_attn_in": "use_attn_in",
    "hook_q_input": "use_split_qkv_input",
    "hook_k_input": "use_split_qkv_input",
    "hook_v_input": "use_split_qkv_input",
    "hook_mlp_in": "use_hook_mlp_in",
    "hook_tokens": "use_hook_tokens",
}


def _opt_in_flag(hook_name: str) -> str | None:
    for suffix, flag in _OPT_IN_HOOKS.items():
        if hook_name == suffix or hook_name.endswith("." + suffix):
            return flag
    return None


class HookedGPT(HookedModule):
    """`HookedModule` with GPT-2's opt-in hook points (each behind a `Config` flag, as in
    transformer-lens) and a `run_with_cache` that stops the forward after the last cached layer."""

    cfg: Config

    def setup_hooks(self) -> None:
        """Index the hook points (an opt-in one only while its flag is on), and move a new model to
        `cfg.device` / `cfg.dtype`."""
        # GPT.__init__ ends here: a new model goes where its config says (cfg.device, cfg.dtype), as
        # transformer-lens' does; from then on the config follows the model.
        new = "hook_dict" not in self.__dict__
        super().setup_hooks()
        all_points = self._all_hook_points
        for name in list(self.hook_dict):
            flag = _opt_in_flag(name)
            if flag and not getattr(self.cfg, flag):
                del self.hook_dict[name]
        self._all_hook_points = all_points
        self._hook_names = list(self.hook_dict)
        p = next((p for p in self.parameters() if p.is_floating_point()), None)
        if new and p is not None and p.device.type != "meta":
            device = p.device if self.cfg.device is None else torch.device(self.cfg.device)
            if (device.type, device.index or 0) != (p.device.type, p.device.index or 0) or self.cfg.dtype != p.dtype:
                self.to(device=device, dtype=self.cfg.dtype)
        self._record_place()

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # Every .to() / .cuda() / .half() ... goes through here: record where the weights went.
        out = super()._apply(fn, *args, **kwargs)
        self._record_place()
        return out

    def _record_place(self) -> None:
        """`cfg.device` and `cfg.dtype` from the weights (the first floating-point parameter)."""
        p = next((p for p in self.parameters() if p.is_floating_point()), None)
        if p is not None and p.device.type != "meta":
            self.cfg.device, self.cfg.dtype = str(p.device), p.dtype

    def _unknown_hook_error(self, name: str) -> KeyError:
        flag = _opt_in_flag(name)
        if self.cfg.attn_only and re.search(r"\.(mlp|ln2)\.|hook_(mlp_in|mlp_out|resid_mid)$", name):
            return KeyError(f"no hook point {name!r}: this model has attn_only=True (no MLP, ln2 or resid_mid)")
        if self.cfg.normalization_type is None and re.search(r"\bln(1|2|_final)\.hook_", name):
            return KeyError(f"no hook point {name!r}: this model has normalization_type=None (no LayerNorm hooks)")
        if flag and not getattr(self.cfg, flag):
            return KeyError(
                f"hook point {name!r} is opt-in and off: set cfg.{flag}=True (model.set_{flag}(True)) to create it"
            )
        return super()._unknown_hook_error(name)

    def _set_flag(self, flag: str, value: bool) -> None:
        setattr(self.cfg, flag, bool(value))
        self.setup_hooks()

    def set_use_attn_result(self, value: bool) -> None:
        """Compute and expose each head's output, `blocks.L.attn.hook_result` [batch, posn, head, d_model]."""
        self._set_flag("use_attn_result", value)

    def set_use_split_qkv_input(self, value: bool) -> None:
        """Give each head its own copy of its Q/K/V input (`hook_q_input` etc.)."""
        self._set_flag("use_split_qkv_input", value)

    def set_use_attn_in(self, value: bool) -> None:
        """Expose the attention input per head as `blocks.L.hook_attn_in`."""
        self._set_flag("use_attn_in", value)

    def set_use_hook_mlp_in(self, value: bool) -> None:
        """Expose the MLP's input as `blocks.L.hook_mlp_in`."""
        if value and self.cfg.attn_only:
            raise ValueError("set_use_hook_mlp_in(True): this model has attn_only=True, so no MLP input to hook")
        self._set_flag("use_hook_mlp_in", value)

    def run_with_cache(self, *model_args: Any, names_filter: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        """Run the model and cache activations (see `HookedModule.run_with_cache`).

        With `return_type=None` nothing downstream of the cached hooks is needed, so the
        forward pass stops after the last layer the filter selects: caching layer 3 of
        12 runs 4 blocks. The output is then None.

        Example:
            >>> _, cache = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern", return_type=None)
        """
        stop = None
        if (
            kwargs.get("return_type", "logits") is None
            and kwargs.get("stop_at_layer") is None
            and not kwargs.get("incl_bwd")
        ):
            names = [hp.name for hp in self.hook_points(names_filter, arg="names_filter")]
            layers = [int(n.split(".")[1]) if n.startswith("blocks.") else self.cfg.n_layers for n in names]
            if names and max(layers) < self.cfg.n_layers - 1 and kwargs.get("start_at_layer") is None:
                stop = max(layers) + 1
        if stop is None:
            return super().run_with_cache(*model_args, names_filter=names_filter, **kwargs)
        _, cache = super().run_with_cache(*model_args, names_filter=names_filter, stop_at_layer=stop, **kwargs)
        return None, cache
