"""GPT-2's activation functions, and the in-place variants the forward uses when nothing
else holds a tensor (a measured speed-up; bit-identical results)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["gelu_new", "gelu_fast", "ACTIVATIONS", "IN_PLACE", "add_bias", "unembed_in_slices"]


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU, the tanh approximation from the original OpenAI code:
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    PyTorch's `gelu(approximate="tanh")` computes exactly this formula in one fused
    kernel (several times faster than writing it out; equal up to float rounding).
    """
    return F.gelu(x, approximate="tanh")


def gelu_fast(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "gelu": F.gelu,
    "relu": F.relu,
}
# The same functions overwriting their input, for when nothing else holds it (see MLP.forward).
IN_PLACE: dict[Callable[..., Tensor], Callable[[Tensor], Tensor]] = {
    gelu_new: lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    F.gelu: torch.ops.aten.gelu_,
    F.relu: torch.relu_,
}


def add_bias(x: Tensor, b: Tensor) -> Tensor:
    """x + b for a fresh matmul output x that nothing else holds.

    With no autograd graph being recorded (inference_mode, no_grad) the bias is added in
    place: no new tensor, one pass over memory fewer. With MLP's in-place activation this took
    2-7% off a GPT-2 forward on a 2-core Intel Xeon VM and changed nothing measurable on a
    2-core AMD EPYC one (`python bench/in_place.py`). Bit-identical.
    Under autocast (x in a lower precision than b) the sum is promoted, as x + b would be.
    """
    if torch.is_grad_enabled() or x.dtype != b.dtype:
        return x + b
    return x.add_(b)


def unembed_in_slices(x: Tensor, W_U: Tensor, b_U: Tensor, width: int = 2048) -> Tensor:
    """x @ W_U + b_U, for a large vocabulary `width` columns at a time (Unembed's CPU fast path).

    GPT-2's W_U (154 MB) is far larger than the CPU's cache; a [d_model, 2048] slice fits, and
    every position reuses it before the next is read. This matmul is a third of a GPT-2 forward,
    and slicing it took the whole forward from ~1.0 to ~0.87 x Hugging Face's time on a 2-core
    CPU (bench/run.py, forward, 4 x 128 tokens). Same values as the one einsum.
    """
    d_vocab = W_U.shape[1]
    if d_vocab <= 2 * width:
        return x @ W_U + b_U
    logits = x.new_empty(*x.shape[:-1], d_vocab)
    for start in range(0, d_vocab, width):
        cols = slice(start, start + width)
        torch.add(x @ W_U[:, cols], b_U[cols], out=logits[..., cols])  # the bias add writes the slice in place
    return logits


def by_heads(x: Tensor, W: Tensor) -> Tensor:
    """`[batch, posn, n_heads, d_head]` the product of `x` `[batch, posn, d_model]` with every head's
    `W` `[n_heads, d_model, d_head]` as one matmul over the heads side by side (`[d_model, n_heads * d_head]`):
    the same sums as the einsum. Under autograd its gradient to x is one matmul too, where the einsum's bmm
    backward is a fifth slower, and 1.3-1.5 x slower in a vmapped backward (`torch.autograd.grad(...,
    is_grads_batched=True)`, which batches the weight per sample: bench/attribution.py's backward passes)."""
    n_heads, d_model, d_head = W.shape
    return (x @ W.transpose(0, 1).reshape(d_model, n_heads * d_head)).unflatten(-1, (n_heads, d_head))
