"""Weight processing as `GPT` methods with transformer-lens 3's names and semantics.

As in transformer-lens, `fold_layer_norm`, `center_writing_weights`, `center_unembed`,
`fold_value_biases` and `refactor_factored_attn_matrices` take a state dict and return a
processed one (the model and the dict passed in are left as they were), while
`process_weights_` and `load_and_process_state_dict` change the model. The maths is
checkpoints/processing.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from ..checkpoints.processing import center_unembed as _center_unembed
from ..checkpoints.processing import center_writing_weights as _center_writing_weights
from ..checkpoints.processing import fold_layer_norm as _fold_layer_norm
from ..checkpoints.processing import fold_value_biases as _fold_value_biases
from ..checkpoints.processing import layer_norm_weights
from ..checkpoints.processing import process_weights as _process_weights
from ..checkpoints.processing import refactor_factored_attn_matrices as _refactor
from .hooked import HookedGPT

__all__ = ["ProcessingMixin"]

_LAYER_NORMS = ("ln1", "ln2")


def _copy(state_dict: dict[str, Tensor], caller: str) -> dict[str, Tensor]:
    if not isinstance(state_dict, dict) or not all(isinstance(v, Tensor) for v in state_dict.values()):
        raise TypeError(f"{caller}: state_dict must be a dict of tensors (e.g. model.state_dict())")
    return {k: v.detach().clone() for k, v in state_dict.items()}


def _require(sd: dict[str, Tensor], keys: list[str], caller: str) -> None:
    missing = [k for k in keys if k not in sd]
    if missing:
        raise KeyError(f"{caller}: the state dict has no {missing[:4]}{' ...' if len(missing) > 4 else ''}")


def _is_own(model: Any, state_dict: dict[str, Tensor]) -> bool:
    """Whether `state_dict` holds `model`'s own parameters (model.state_dict(): the same storage)."""
    params = dict(model.named_parameters())
    return bool(params) and all(k in state_dict and state_dict[k].data_ptr() == p.data_ptr() for k, p in params.items())


class ProcessingMixin(HookedGPT):
    """transformer-lens' weight-processing methods, `n_params`, and `cfg.device` / `cfg.dtype` kept in step."""

    # Set where fold_ln ran (from_pretrained, load_and_process_state_dict): the LayerNorm weights and
    # biases it folded away, by their raw names ("blocks.0.ln2.w"), float32 on the CPU.
    folded_layer_norms: dict[str, Tensor]

    # ----- state dict in, state dict out -----------------------------------
    def fold_layer_norm(
        self, state_dict: dict[str, Tensor], fold_biases: bool = True, center_weights: bool = True
    ) -> dict[str, Tensor]:
        """A copy of `state_dict` with each LayerNorm's weight (and bias, with `fold_biases`) folded into
        the layer that reads it, and, with `center_weights`, those weights centred along d_model. The
        LayerNorms' entries stay, set to the identity (w = 1, b = 0), as transformer-lens leaves them.

        Example:
            >>> raw = GPT.from_pretrained_no_processing("tiny-gpt2")
            >>> folded = raw.fold_layer_norm(raw.state_dict())
            >>> bool((folded["blocks.0.ln1.w"] == 1).all())
            True
        """
        sd = _copy(state_dict, "fold_layer_norm")
        names = [f"blocks.{L}.{ln}" for L in range(self.cfg.n_layers) for ln in _LAYER_NORMS] + ["ln_final"]
        present = [n for n in names if f"{n}.w" in sd]
        if not present:
            raise KeyError(
                "fold_layer_norm: the state dict has no LayerNorm weights (e.g. 'blocks.0.ln1.w'): "
                "it is folded already, or not this model's"
            )
        _fold_layer_norm(sd, self.cfg, center_weights=center_weights, fold_biases=fold_biases)
        for n in present:  # folded away: the identity LayerNorm weights transformer-lens leaves in place
            w = state_dict[f"{n}.w"]
            sd[f"{n}.w"] = torch.ones_like(w)
            if fold_biases:
                sd[f"{n}.b"] = torch.zeros_like(w)
        return {k: sd[k] for k in state_dict}  # the caller's order

    def center_writing_weights(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A copy of `state_dict` in which everything writing to the residual stream (W_E, W_pos, W_O, b_O,
        W_out, b_out) writes mean-zero vectors.

        Example:
            >>> sd = model.center_writing_weights(model.state_dict())
        """
        sd = _copy(state_dict, "center_writing_weights")
        _require(sd, ["embed.W_E", "pos_embed.W_pos"], "center_writing_weights")
        _center_writing_weights(sd, self.cfg)
        return sd

    def center_unembed(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A copy of `state_dict` with W_U and b_U centred over the vocabulary (log-probs unchanged).

        Example:
            >>> sd = model.center_unembed(model.state_dict())
        """
        sd = _copy(state_dict, "center_unembed")
        _require(sd, ["unembed.W_U", "unembed.b_U"], "center_unembed")
        _center_unembed(sd)
        return sd

    def fold_value_biases(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A copy of `state_dict` with each layer's b_V moved into its b_O (`b_O += sum_h b_V[h] @ W_O[h]`).

        Example:
            >>> sd = model.fold_value_biases(model.state_dict())
        """
        sd = _copy(state_dict, "fold_value_biases")
        _fold_value_biases(sd, self.cfg)
        return sd

    def refactor_factored_attn_matrices(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A copy of `state_dict` with each head's W_Q/W_K (biases included) and W_V/W_O re-split by SVD so
        that QK and OV are unchanged but the factors are even (see `processing.refactor_factored_attn_matrices`).

        Example:
            >>> sd = model.refactor_factored_attn_matrices(model.state_dict())
        """
        sd = _copy(state_dict, "refactor_factored_attn_matrices")
        _refactor(sd, self.cfg)
        return sd

    # ----- in place ----------------------------------------------------------
    def load_and_process_state_dict(
        self,
        state_dict: dict[str, Tensor],
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
        refactor_factored_attn_matrices: bool = False,
    ) -> None:
        """Process a state dict in this model's layout (the caller's is left as it is) and load it,
        as transformer-lens' method of this name. Folding LayerNorms turns the model's into
        centre-and-scale only ones (`cfg.normalization_type = "LNPre"`); hooks on their hook points go.

        Example:
            >>> other = GPT.from_pretrained_no_processing("tiny-gpt2")   # raw weights
            >>> model.load_and_process_state_dict(other.state_dict())    # processed as model's were
        """
        sd = _copy(state_dict, "load_and_process_state_dict")
        buffers = {name for name, _ in self.named_buffers()}  # the attention's "mask" and "IGNORE": not weights
        kept = {k: sd.pop(k) for k in list(sd) if k in buffers}
        has_ln = any(k.endswith((".ln1.w", ".ln2.w")) or k == "ln_final.w" for k in sd)
        fold = fold_ln and has_ln  # nothing to fold: transformer-lens skips it too
        # Checked before anything changes: a state dict that does not fit leaves the model as it was.
        expected = {k: p.shape for k, p in self.named_parameters()}
        if self.cfg.normalization_type != "LN":  # parameterless LayerNorms: the dict may hold (foldable) ones
            expected |= {
                k: v.shape for k, v in sd.items() if k.rsplit(".", 2)[-2:-1] in (["ln1"], ["ln2"], ["ln_final"])
            }
            if has_ln and not fold_ln:
                raise ValueError(
                    "load_and_process_state_dict: the state dict has LayerNorm weights but this model's LayerNorms "
                    f"have none (cfg.normalization_type={self.cfg.normalization_type!r}): pass fold_ln=True"
                )
        missing, unexpected = sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected))
        misshaped = [
            f"{k} {tuple(sd[k].shape)} (expected {tuple(v)})"
            for k, v in expected.items()
            if k in sd and sd[k].shape != v
        ]
        if missing or unexpected or misshaped:
            raise KeyError(
                "load_and_process_state_dict: the state dict does not fit this model: "
                f"missing {missing[:6]}, unexpected {unexpected[:6]}, mis-shaped {misshaped[:6]}"
            )
        own = _is_own(self, state_dict)  # this model's weights again (process_weights_): its checkpoint's norms hold
        cfg = dataclasses.replace(self.cfg, normalization_type="LN") if fold else self.cfg
        _process_weights(sd, cfg, fold, center_writing_weights, center_unembed, fold_value_biases, inplace=True)
        if refactor_factored_attn_matrices:
            _refactor(sd, cfg)
        if fold and self.cfg.normalization_type == "LN":
            self.cfg.normalization_type = "LNPre"
            self._rebuild_layer_norms()
        # The LayerNorms folded away are those of what was loaded, whatever the model held before: a
        # transcoder made for raw weights is converted with them. A dict folded already records none.
        if fold:
            self.folded_layer_norms = layer_norm_weights(state_dict)  # what fold_ln took away
        elif not own and "folded_layer_norms" in self.__dict__:
            del self.folded_layer_norms  # another checkpoint's: unknown, so refused by name, never used stale
        self.load_state_dict({**sd, **kept}, strict=False)

    def process_weights_(
        self,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
    ) -> None:
        """Process this model's own weights in place (fold_value_biases too), as transformer-lens' method.

        Example:
            >>> model = GPT.from_pretrained_no_processing("tiny-gpt2")
            >>> model.process_weights_()          # now as from_pretrained("tiny-gpt2") loads it
        """
        self.load_and_process_state_dict(
            self.state_dict(),
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )

    def _rebuild_layer_norms(self) -> None:
        """Every LayerNorm rebuilt for the current cfg (after a fold: parameterless), hook points renamed."""
        gpt: Any = self  # GPT's blocks and ln_final
        for block in gpt.blocks:
            for ln in _LAYER_NORMS:
                setattr(block, ln, type(getattr(block, ln))(self.cfg))
        gpt.ln_final = type(gpt.ln_final)(self.cfg)
        self.setup_hooks()

    # ----- counts ------------------------------------------------------------
    @property
    def n_params(self) -> int:
        """`cfg.n_params`: the hidden weights W_Q, W_K, W_V, W_O, W_in, W_out (transformer-lens' count;
        `n_params_total` counts every parameter)."""
        return self.cfg.n_params

    @property
    def n_params_total(self) -> int:
        """Every parameter, embeddings, biases and LayerNorm weights included (transformer-lens' name)."""
        return sum(p.numel() for p in self.parameters())
