"""`Architecture`: what one SAE architecture adds to the shared SAE, in one small module.

An architecture says which tensors it holds (`shapes`), which config fields are its own (`fields`,
with their defaults: a field of another architecture is refused by name), how it encodes and
decodes (`encode`, `decode`), and, when it trains, its loss (`losses`) and what it does around an
optimiser step (`before_step`, `after_step`). `interp_gpt.sae.SAE` and `SAETrainer` call these and
hold everything else: the input normalisation, the hook points, the optimiser, the schedules, the
dead-feature accounting and the NaN rules.

Example (how a module registers one; see `standard.py`):
    >>> class Standard(Architecture):
    ...     name = "standard"
    ...     def activation(self, sae, hidden_pre):
    ...         return torch.relu(hidden_pre)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ..config import SAEConfig

__all__ = ["Architecture", "mse_of", "decoder_norms", "folded_bias"]


def mse_of(x_hat: Tensor, x: Tensor) -> Tensor:
    """sae-lens' reconstruction loss: squared error summed over d_in, mean over rows."""
    return (x_hat - x).pow(2).sum(-1).mean()


def decoder_norms(sae: Any) -> Tensor:
    """`||W_dec[i]||` per feature `[d_sae]`."""
    return sae.W_dec.norm(dim=-1)


def folded_bias(sae: Any, bias: Tensor | None = None) -> Tensor:
    """`bias - b_dec @ W_enc` (with apply_b_dec_to_input; else `bias`), `bias` b_enc by default:
    `(x - b_dec) @ W_enc + bias` is `x @ W_enc + folded_bias`, the same value as one addmm on x, whose
    backward needs no `[n, d_in]` input gradient (b_dec's is `-grad_bias @ W_enc.T`)."""
    bias = sae.b_enc if bias is None else bias
    return bias - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else bias  # type: ignore[no-any-return]


class Architecture:
    """One SAE architecture (sae-lens' name in `name`). Subclasses override what differs from the
    standard ReLU SAE: encode `(x - b_dec) @ W_enc + b_enc` then `activation`, decode `f @ W_dec + b_dec`."""

    name: ClassVar[str] = ""
    # The config fields this architecture owns, with their defaults (filled in when None). Every other
    # architecture's fields must keep the dataclass default (None or False): set, they are refused.
    fields: ClassVar[dict[str, Any]] = {}
    trainable: ClassVar[bool] = True
    # The architecture sae-lens saves it as for inference (BatchTopK saves as "jumprelu").
    saved_as: ClassVar[str | None] = None
    # The trainer's default for `normalize_decoder` (keep the decoder rows at unit norm).
    unit_norm_decoder: ClassVar[bool] = False

    # ----- the tensors and the config ---------------------------------------------------------
    def shapes(self, cfg: SAEConfig) -> dict[str, tuple[int, ...]]:
        """The tensors it holds, with sae-lens' names and shapes."""
        return {
            "W_enc": (cfg.d_in, cfg.d_sae),
            "W_dec": (cfg.d_sae, cfg.d_in),
            "b_enc": (cfg.d_sae,),
            "b_dec": (cfg.d_in,),
        }

    def derived_tensor(self, sae: Any, name: str) -> Tensor | None:
        """A tensor it does not hold but sae-lens exposes, by name (a tied SAE's `W_enc` is `W_dec.T`), or None."""
        return None

    def build(self, sae: Any) -> None:
        """Register on `sae` the tensors of `shapes` whose names hold a dot (a submodule's, such as
        `attn_layers.0.k_ctx.weight`), on its device and dtype; `SAE.__init__` registers the plain
        names. Default: none."""

    def buffers(self, cfg: SAEConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Buffers it holds beside `shapes` (name -> (shape, dtype)): in its state dict and files, never
        trained by the optimiser (BatchTopK's running `topk_threshold`, float64 as in sae-lens)."""
        return {}

    def float32_params(self, cfg: SAEConfig) -> tuple[str, ...]:
        """Parameters kept in float32 (float64 in a float64 SAE) whatever the SAE's dtype: when built, cast
        and loaded (a JumpReLU threshold: sae-lens' #728)."""
        return ()

    def check_config(self, cfg: SAEConfig) -> None:
        """Check this architecture's own fields' values (after the defaults are filled in)."""

    def cfg_json_fields(self, cfg: SAEConfig) -> dict[str, Any]:
        """Its fields as sae-lens writes them into cfg.json (after the shared ones)."""
        return {name: getattr(cfg, name) for name in self.fields}

    # ----- inference ----------------------------------------------------------------------
    def hidden_pre(self, sae: Any, x: Tensor, hp: dict[str, Any]) -> Tensor:
        """`(x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc` through `hook_sae_acts_pre`."""
        sae_in = x - sae.b_dec * sae.cfg.apply_b_dec_to_input
        return hp["hook_sae_acts_pre"](sae_in @ sae.W_enc + sae.b_enc)  # type: ignore[no-any-return]

    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        """The feature activations of the pre-activations (ReLU here)."""
        return torch.relu(hidden_pre)

    def encode(self, sae: Any, x: Tensor, hp: dict[str, Any]) -> Tensor:
        """Feature activations of `x` (already normalised), before `hook_sae_acts_post`."""
        return self.activation(sae, self.hidden_pre(sae, x, hp))

    def encode_with_state(self, sae: Any, x: Tensor, hp: dict[str, Any], state: dict[str, Any]) -> Tensor:
        """`encode`, free to keep in `state` what `forward_decode` needs later in the pass. Default: keeps nothing."""
        return self.encode(sae, x, hp)

    def decode(self, sae: Any, feature_acts: Tensor) -> Tensor:
        """The reconstruction of feature activations, before `hook_sae_recons`."""
        return feature_acts @ sae.W_dec + sae.b_dec

    def forward_decode(self, sae: Any, feature_acts: Tensor, state: dict[str, Any], hp: dict[str, Any]) -> Tensor:
        """The reconstruction `forward` (and a splice) outputs, before the input's normalisation is undone.
        Default: `decode` through `hook_sae_recons`, as the public `decode`."""
        return hp["hook_sae_recons"](self.decode(sae, feature_acts))  # type: ignore[no-any-return]

    def init_extra(self, sae: Any, gen: torch.Generator | None) -> None:
        """After `SAE.init_weights`' shared initialisation: initialise what this architecture initialises
        its own way (e.g. the tensors `build` registered). Default: nothing."""

    # ----- training -----------------------------------------------------------------------
    def unit_norm_decoder_default(self, cfg: SAEConfig) -> bool:
        """The trainer's default for `normalize_decoder` with this config (`unit_norm_decoder` here)."""
        return self.unit_norm_decoder

    def check_trainable(self, sae: Any, trainer: Any) -> None:
        """Refuse, by name, an SAE this architecture cannot train as configured."""
        if not self.trainable:
            raise ValueError(f"sae.cfg.architecture={self.name!r} is inference only here (as in sae-lens)")

    def init_weights(self, trainer: Any, x: Tensor) -> None:
        """Training initialisation, from the first batch `x` (the trainer's default unless overridden)."""
        trainer.default_init(x)

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss on a batch `[n, d_in]` and its parts: "mse", this architecture's terms,
        "feats" (the feature activations, detached) and optionally "fired" (bool `[d_sae]`)."""
        raise NotImplementedError(f"{self.name}: no training loss")

    def before_step(self, trainer: Any) -> None:
        """After backward, before the optimiser step (e.g. project the gradient)."""

    def after_step(self, trainer: Any, parts: dict[str, Tensor]) -> None:
        """After the optimiser step (e.g. renormalise, update a running threshold)."""

    def inference_state(self, sae: Any, state: dict[str, Tensor]) -> tuple[dict[str, Any], dict[str, Tensor]]:
        """(cfg.json fields to change, state dict) as sae-lens saves a trained SAE for inference."""
        return {}, state

    def extra_repr(self, cfg: SAEConfig) -> str:
        """Its own fields, for `repr(sae)`."""
        return "".join(f", {name}={getattr(cfg, name)!r}" for name in self.fields)
