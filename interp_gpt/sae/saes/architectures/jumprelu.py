"""The JumpReLU SAE (sae-lens' JumpReLUSAE, and its JumpReLUTrainingSAE): a feature fires only above
its learned threshold.

    h = (x - b_dec) @ W_enc + b_enc
    f = ReLU(h) * (h > threshold)                          (h * (h > threshold) in training: threshold >= 0)
    loss = ||x_hat - x||^2 + c * mean_rows S(h) [+ pre_act_loss_coefficient * mean_rows
           sum_{i dead} ReLU(threshold_i - h_i) * ||W_dec[i]||]

The sparsity loss S (`jumprelu_sparsity_loss_mode`): "step" (DeepMind) the L0, `sum_i H(h_i - threshold_i)`;
"quadratic" (Gemma Scope 2) `2 / target_l0 * (L0 - target_l0)^2`; "tanh" (Anthropic)
`sum_i tanh(jumprelu_tanh_scale * f_i * ||W_dec[i]||)`. `c = l0_coefficient`, warmed up over
`l0_warm_up_steps`. The jump and the step give the threshold no gradient; straight-through estimators
do, through the kernel K = 1 on (-1/2, 1/2) of width bw = `jumprelu_bandwidth`:
`df/dthreshold = -(threshold / bw) K((h - threshold) / bw)`, `dH/dthreshold = -(1 / bw) K(...)`; with
`jumprelu_ste_to_input` (Anthropic) the estimators reach h too. `init_weights` starts as sae-lens' trainer
does (decoder rows of norm 0.1, the encoder their transpose, b_enc 0) with every threshold at
`jumprelu_init_threshold`; the threshold is projected to >= 0 before every step.

The threshold stays float32 whatever the SAE's dtype (float64 in a float64 SAE). Adam moves a parameter
about lr per step, and a bfloat16 threshold near 1 moves in steps of 2^-7: such updates round away and
it silently stops learning (sae-lens #728). It is float32 when built, after `sae.to(torch.bfloat16)`, and
when loaded: a file that stores it in bfloat16 / float16 (sae-lens' own bfloat16 saves do) is read into
float32, exactly, so inference is unchanged (it compares in the compute dtype, as sae-lens) and training
moves a float32 copy; refusing those files would refuse sae-lens' saves for no gain. `SAETrainer` refuses,
by name, a threshold that is not float32 when training starts (only a replaced parameter can be, e.g.
`load_state_dict(state, assign=True)` with a bfloat16 tensor).

Speed: once sparse, a step reads only the positions that fire or sit in the estimators' window
(`Support`): the decode, its backward and the sparsity loss cost |positions| * d_in, not n * d_sae * d_in.

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="jumprelu", dtype="bfloat16",
    ...                     metadata={"hook_name": "blocks.1.hook_resid_pre"}))
    >>> sae.threshold.dtype
    torch.float32
    >>> SAETrainer(sae, SAETrainingConfig(l0_coefficient=2.0, jumprelu_init_threshold=0.1)).train(batches, 500)
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import Architecture, decoder_norms, folded_bias, mse_of
from .sparse import Support, rectangle, sparse_enough

__all__ = ["JumpReLU", "jump_relu", "step", "pre_act_loss"]


class JumpReLU(Architecture):
    """ReLU gated by a per-feature threshold (sae-lens' "jumprelu"); inference and training."""

    name: ClassVar[str] = "jumprelu"

    def shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]:
        return {**super().shapes(cfg), "threshold": (cfg.d_sae,)}

    def float32_params(self, cfg: Any) -> tuple[str, ...]:
        return ("threshold",)

    def activation(self, sae: Any, hidden_pre: Tensor) -> Tensor:
        threshold = sae.threshold.to(hidden_pre.dtype)
        return torch.relu(hidden_pre) * (hidden_pre > threshold).to(hidden_pre.dtype)

    # ----- training -----------------------------------------------------------------------
    def check_trainable(self, sae: Any, trainer: Any) -> None:
        if sae.threshold.dtype not in (torch.float32, torch.float64):
            raise TypeError(
                f"sae.threshold has dtype {sae.threshold.dtype}: a JumpReLU threshold trains in float32 (in "
                "bfloat16 / float16 Adam's lr-sized steps round away and it silently stops learning: sae-lens "
                "#728); the parameter was replaced (e.g. load_state_dict(..., assign=True) with a half-precision "
                "tensor). Restore it with sae.threshold.data = sae.threshold.data.float()"
            )
        c = trainer.cfg
        mode, target = c.jumprelu_sparsity_loss_mode, c.target_l0
        if mode == "quadratic" and target is None:
            raise ValueError(
                "jumprelu_sparsity_loss_mode='quadratic' needs target_l0 (the L0 its penalty pulls each row "
                "towards), got target_l0=None"
            )
        if target is not None and mode != "quadratic":
            raise ValueError(
                f"target_l0={target!r} is read only by jumprelu_sparsity_loss_mode='quadratic' (the mode is "
                f"{mode!r}): set the mode to 'quadratic' or leave target_l0=None"
            )
        if target is not None and not 0 < target <= sae.cfg.d_sae:
            raise ValueError(
                f"target_l0={target!r} is out of range: expected a number > 0 and <= d_sae={sae.cfg.d_sae}"
            )

    @torch.no_grad()
    def init_weights(self, trainer: Any, x: Tensor) -> None:
        """sae-lens' training init (see `SAETrainer.default_init`), every threshold at jumprelu_init_threshold."""
        trainer.default_init(x)
        trainer.sae.threshold.fill_(trainer.cfg.jumprelu_init_threshold)

    def losses(self, trainer: Any, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """MSE, the sparsity loss ("l0_loss") and, with pre_act_loss_coefficient, "pre_act_loss". The decode
        and the sparsity loss run on the positions that fire or sit in the window once they are few."""
        sae, c = trainer.sae, trainer.cfg
        with torch.no_grad():  # sae-lens' projection: below 0 the gate would pass negative pre-activations
            sae.threshold.clamp_(min=0.0)
        bias = folded_bias(sae)
        hidden_pre = torch.addmm(bias, x, sae.W_enc)  # [n, d_sae]
        threshold = sae.threshold.to(hidden_pre.dtype)
        bw, to_input, mode = c.jumprelu_bandwidth, c.jumprelu_ste_to_input, c.jumprelu_sparsity_loss_mode
        norms = decoder_norms(sae)
        with torch.no_grad():  # fires (h > threshold) or sits in the window: the positions with a gradient
            near = (hidden_pre - threshold).div_(bw) > -0.5
        if sparse_enough(near):
            s = Support.of(near)
            h = s.encoder_entries(hidden_pre.detach(), x, sae.W_enc, bias)  # [|s|]
            t = threshold.index_select(0, s.cols)
            acts = jump_relu(h, t, bw, to_input)
            x_hat = s.decode(acts, sae.W_dec) + sae.b_dec
            if mode == "tanh":
                per_row = s.row_sum(torch.tanh(c.jumprelu_tanh_scale * acts * norms.index_select(0, s.cols)))
            else:
                per_row = s.row_sum(step(h, t, bw, to_input))
            feats, fired = s.dense(acts), s.fired(acts != 0)
        else:
            acts = jump_relu(hidden_pre, threshold, bw, to_input)
            x_hat = torch.addmm(sae.b_dec, acts, sae.W_dec)
            if mode == "tanh":
                per_row = torch.tanh(c.jumprelu_tanh_scale * acts * norms).sum(-1)
            else:
                per_row = step(hidden_pre, threshold, bw, to_input).sum(-1)
            feats = acts.detach()
            fired = (feats != 0).any(0)
        if mode == "quadratic":
            per_row = 2 / c.target_l0 * (per_row - c.target_l0) ** 2
        mse = mse_of(x_hat, x)
        l0_loss = (trainer.coefficient(c.l0_coefficient, c.l0_warm_up_steps) * per_row).mean()
        loss = mse + l0_loss
        parts = {"mse": mse, "l0_loss": l0_loss, "feats": feats, "x_hat": x_hat.detach(), "fired": fired}
        if c.pre_act_loss_coefficient is not None:
            parts["pre_act_loss"] = pre_act_loss(
                c.pre_act_loss_coefficient, hidden_pre, threshold, norms, trainer.dead_mask()
            )
            loss = loss + parts["pre_act_loss"]
        return loss, parts


def pre_act_loss(coefficient: float, hidden_pre: Tensor, threshold: Tensor, norms: Tensor, dead: Tensor) -> Tensor:
    """Anthropic's pre-activation loss on the dead features only (as sae-lens): `coefficient *
    mean_rows sum_{i dead} ReLU(threshold_i - h_i) * ||W_dec[i]||`; 0 while none is dead."""
    cols = dead.nonzero().squeeze(1)
    if not len(cols):
        return hidden_pre.new_zeros(())
    gap = (threshold.index_select(0, cols) - hidden_pre.index_select(1, cols)).relu()
    return coefficient * (gap * norms.index_select(0, cols)).sum(-1).mean()


def _sum_to(grad: Tensor, like: Tensor) -> Tensor:
    """A gradient summed over the axes `like` was broadcast along (`[n, d_sae]` -> `[d_sae]`)."""
    return grad if grad.shape == like.shape else grad.reshape(-1, *like.shape).sum(0)


class _JumpReLU(torch.autograd.Function):
    """`h * (h > t)`: to h the gate (plus the estimator with `to_input`), to t `-(t / bw) K((h - t) / bw)`."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, t: Tensor, bw: float, to_input: bool) -> Tensor:
        ctx.save_for_backward(h, t)
        ctx.bw, ctx.to_input = bw, to_input
        return h * (h > t).to(h.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:  # type: ignore[override]
        h, t = ctx.saved_tensors
        estimate = (t / ctx.bw) * rectangle((h - t) / ctx.bw) * grad
        to_h = (h > t).to(grad.dtype) * grad
        return (to_h + estimate if ctx.to_input else to_h), _sum_to(-estimate, t), None, None


class _Step(torch.autograd.Function):
    """`H(h - t)`: to t `-(1 / bw) K((h - t) / bw)`; to h the opposite with `to_input`, else nothing."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, t: Tensor, bw: float, to_input: bool) -> Tensor:
        ctx.save_for_backward(h, t)
        ctx.bw, ctx.to_input = bw, to_input
        return (h > t).to(h.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor, None, None]:  # type: ignore[override]
        h, t = ctx.saved_tensors
        estimate = (1.0 / ctx.bw) * rectangle((h - t) / ctx.bw) * grad
        return (estimate if ctx.to_input else None), _sum_to(-estimate, t), None, None


def jump_relu(h: Tensor, threshold: Tensor, bandwidth: float, ste_to_input: bool = False) -> Tensor:
    """`h * (h > threshold)` with the straight-through estimator's gradient to the threshold (and to h
    with `ste_to_input`). `threshold` is `[d_sae]` against `h` `[..., d_sae]`, or `h`'s own shape.

    Example:
        >>> jump_relu(torch.tensor([[0.2, 0.6]]), torch.tensor([0.5, 0.5]), 0.05)
        tensor([[0.0000, 0.6000]])
    """
    return _JumpReLU.apply(h, threshold, bandwidth, ste_to_input)  # type: ignore[no-any-return]


def step(h: Tensor, threshold: Tensor, bandwidth: float, ste_to_input: bool = False) -> Tensor:
    """`(h > threshold)` as floats, with the straight-through estimator's gradient (see `jump_relu`).

    Example:
        >>> step(torch.tensor([[0.2, 0.6]]), torch.tensor([0.5, 0.5]), 0.05).sum(-1)   # the L0
        tensor([1.])
    """
    return _Step.apply(h, threshold, bandwidth, ste_to_input)  # type: ignore[no-any-return]
