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
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from ..config import SAEConfig

__all__ = [
    "Architecture",
    "mse_of",
    "decoder_norms",
    "folded_bias",
    "folded_hidden_pre",
    "active_entries",
    "decode_rows",
    "sparse_enough",
    "SPARSE_BELOW",
]

# Train through the active features alone when fewer than this share of [n, d_sae] is active: the dense
# decode, its two backward matmuls and the encoder's weight gradient cost n * d_sae * d_in each, the
# sparse ones nnz * d_in.
SPARSE_BELOW = 0.1


def mse_of(x_hat: Tensor, x: Tensor) -> Tensor:
    """sae-lens' reconstruction loss: squared error summed over d_in, mean over rows."""
    return (x_hat - x).pow(2).sum(-1).mean()


def decoder_norms(sae: Any) -> Tensor:
    """`||W_dec[i]||` per feature `[d_sae]`."""
    return sae.W_dec.norm(dim=-1)


def folded_bias(sae: Any) -> Tensor:
    """`b_enc - b_dec @ W_enc` (with apply_b_dec_to_input; else b_enc): `(x - b_dec) @ W_enc + b_enc`
    is `x @ W_enc + folded_bias`, the same value without the `[n, d_in]` input gradient."""
    return sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc  # type: ignore[no-any-return]


def folded_hidden_pre(sae: Any, x: Tensor) -> Tensor:
    """`(x - b_dec) @ W_enc + b_enc` for training, as `x @ W_enc + folded_bias(sae)` (one matmul of
    n * d_sae * d_in saved per step)."""
    return torch.addmm(folded_bias(sae), x, sae.W_enc)


class _ActiveEntries(torch.autograd.Function):
    """`pre[rows, cols]` of `pre = x @ w + bias` (computed without autograd), with the gradient to `w` and
    `bias` through those entries alone: `dw[:, c] = sum over entries (r, c) of x[r] * g`, one sparse
    product of nnz * d_in work rather than the dense `x.T @ dpre` of n * d_in * d_sae."""

    @staticmethod
    def forward(ctx: Any, pre: Tensor, x: Tensor, w: Tensor, bias: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
        ctx.save_for_backward(x, rows, cols)
        ctx.n_features = w.shape[1]
        return pre[rows, cols]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, rows, cols = ctx.saved_tensors
        d_sae = ctx.n_features
        coo = torch.sparse_coo_tensor(torch.stack([cols, rows]), grad, (d_sae, x.shape[0]), check_invariants=False)
        grad_w = torch.sparse.mm(coo, x).T.contiguous()  # [d_in, d_sae]
        grad_bias = torch.zeros(d_sae, dtype=grad.dtype, device=grad.device).index_add_(0, cols, grad)
        return None, None, grad_w, grad_bias, None, None


def active_entries(pre: Tensor, x: Tensor, w: Tensor, bias: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """The entries `(rows, cols)` of `pre = x @ w + bias` (`pre` computed without autograd), flat, with
    autograd to `w` and `bias` at nnz * d_in cost (see `_ActiveEntries`)."""
    return _ActiveEntries.apply(pre, x, w, bias, rows, cols)  # type: ignore[no-any-return]


def decode_rows(values: Tensor, cols: Tensor, counts: Tensor, w_dec: Tensor, b_dec: Tensor) -> Tensor:
    """`sum_j values[j] * w_dec[cols[j]] + b_dec` per row, rows holding `counts` entries each in order
    (embedding_bag: nnz * d_in work forward and backward, rather than n * d_sae * d_in)."""
    offsets = torch.cumsum(counts, 0) - counts
    return F.embedding_bag(cols, w_dec, offsets=offsets, per_sample_weights=values, mode="sum") + b_dec


def sparse_enough(active: Tensor) -> bool:
    """Whether few enough entries are active for the sparse path (`SPARSE_BELOW`)."""
    return int(active.sum()) < SPARSE_BELOW * active.numel()


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
    # The loss parts this architecture logs beside "mse" (e.g. "l1", "aux").
    loss_names: ClassVar[tuple[str, ...]] = ()
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

    def float32_params(self, cfg: SAEConfig) -> tuple[str, ...]:
        """Parameters kept in float32 whatever the SAE's dtype (a JumpReLU threshold: sae-lens' #728)."""
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
