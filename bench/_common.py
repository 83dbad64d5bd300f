"""Helpers shared by the benchmark scripts: the checkpoint, interleaved timing, memory
readings, FLOP counts and the matmul roofline.

Nothing here imports transformer-lens or transformers at module level, so a worker
process that measures one library pays only for that library's import.
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


# ----------------------------------------------------------------------------
# The research codes' hard-coded CUDA
# ----------------------------------------------------------------------------
class TorchOn:
    """`torch` as a module that writes `torch.zeros(..., device="cuda")` should see it on a machine without
    CUDA (the EAP-IG code does): set as that module's global `torch`, its `zeros(device="cuda")` lands on
    `device`, and every other name is torch's. Their files stay as they are."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def zeros(self, *size: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*size, device=self.device if device == "cuda" else device, **kwargs)


# ----------------------------------------------------------------------------
# The checkpoint
# ----------------------------------------------------------------------------
def checkpoint(folder: str | os.PathLike | None = None, seed: int = 0) -> tuple[Path, str]:
    """A GPT-2-small-shaped Hugging Face checkpoint with seeded random weights, and how
    it was made: `interp_gpt.cli.random_gpt2_small`, built once, then reused."""
    from interp_gpt.cli.commands import _home, random_gpt2_small

    target = Path(folder) if folder else _home() / f"random-gpt2-small-seed{seed}"
    return random_gpt2_small(seed=seed, folder=target), "interp_gpt.cli.random_gpt2_small"


def random_tokens(batch: int, pos: int, d_vocab: int = 50257, seed: int = 0) -> Tensor:
    # Keep clear of 50256 (<|endoftext|>) so no generator stops or treats it specially.
    return torch.randint(0, d_vocab - 1, (batch, pos), generator=torch.Generator().manual_seed(seed))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """`--shapes` text such as "4x128,1x1024" as (batch, positions) pairs; ValueError (the message names
    the flag and the entry) for anything but pairs of positive integers."""
    shapes = []
    for shape in text.split(","):
        parts = shape.strip().lower().split("x")
        if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
            raise ValueError(f"--shapes: expected BATCHxPOS pairs of positive integers such as 4x128, got {shape!r}")
        shapes.append((int(parts[0]), int(parts[1])))
    return shapes


def edge_hooked_transformer(model: Any, device: str = "cpu") -> Any:
    """A transformer-lens `HookedTransformer` holding `model`'s (unprocessed) weights, with the hooks the
    edge-attribution references read (`use_attn_result`, `use_split_qkv_input`, `use_hook_mlp_in`): our
    parameter names are transformer-lens', so the state dict loads as it is. Any release with
    `HookedTransformer` (2.x, 3.x), imported here, not at module level."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    c = model.cfg
    tl_cfg = HookedTransformerConfig(
        n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head, d_mlp=c.d_mlp,
        d_vocab=c.d_vocab, n_ctx=c.n_ctx, act_fn=c.act_fn, eps=c.layer_norm_eps,
        normalization_type=c.normalization_type, positional_embedding_type="standard",
        use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True, device=device,
    )  # fmt: skip
    tl = HookedTransformer(tl_cfg)
    weights = {k: v for k, v in model.state_dict().items() if not k.endswith(("IGNORE", "mask"))}
    missing, unexpected = tl.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith(("IGNORE", "mask")) for k in missing), (missing, unexpected)
    return tl.eval()


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------
def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1, device: str = "cpu"
) -> dict[str, list[float]]:
    """Wall times of each function, run in rounds A B C, A B C, ... so that a burst of
    machine noise lands on every competitor rather than on whichever ran then.

    `warmup` rounds run first and are not recorded. Each output is dropped before the
    next call, so no competitor runs with another's tensors still alive.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            gc.collect()
            synchronize(device)
            t0 = time.perf_counter()
            out = fn()
            synchronize(device)
            elapsed = time.perf_counter() - t0
            del out
            if round_ >= warmup:
                times[name].append(elapsed)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ----------------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def rss_bytes() -> int:
    """Resident set size now (VmRSS)."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Peak resident set size since start or since the last `reset_peak_rss()` (VmHWM)."""
    return _status_kib("VmHWM") * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs). False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def return_freed_memory_to_os() -> None:
    """Make glibc hand large freed blocks straight back to the OS.

    By default glibc raises its mmap threshold after the first large free and then
    serves big tensors from a heap it keeps; a later measurement would then see a
    smaller RSS increase just because memory was already resident. Fixing the
    threshold (mallopt M_MMAP_THRESHOLD = 128 KiB) makes every large tensor its own
    mapping, released on free, so "peak RSS - RSS before" is the call's own need.
    Used only in the memory-measuring worker processes, never where we time.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def memory_in_use(device: str = "cpu") -> int:
    """RSS on the CPU; torch's allocated bytes on CUDA (after a gc)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    return rss_bytes()


class PeakMemory:
    """Peak memory increase of the code inside `with`, over what was in use on entry.

    CPU: peak RSS (VmHWM) minus RSS on entry. CUDA: torch's peak allocated bytes minus
    allocated bytes on entry. `increase` is None where the peak cannot be reset.
    """

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.increase: int | None = None
        self.peak: int | None = None
        self.entry: int | None = None

    def __enter__(self) -> PeakMemory:
        self.entry = memory_in_use(self.device)
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self._ok = True
        else:
            self._ok = reset_peak_rss()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self.peak = peak_rss_bytes()
        self.increase = self.peak - self.entry if self._ok else None


def cache_bytes(cache: Any) -> tuple[int, int]:
    """(sum of the cached tensors' nbytes, bytes of the distinct storages behind them).

    The two differ where hooks cache views of one tensor: e.g. our `unembed.hook_out`
    is the logits tensor itself, which the forward returns anyway.
    """
    tensors = [t for t in getattr(cache, "cache_dict", cache).values() if isinstance(t, Tensor)]
    total = sum(t.nbytes for t in tensors)
    storages: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return total, sum(storages.values())


# ----------------------------------------------------------------------------
# FLOPs and the roofline
# ----------------------------------------------------------------------------
def forward_flops(
    batch: int, pos: int, n_layers: int = 12, d_model: int = 768, d_mlp: int = 3072, d_vocab: int = 50257
) -> dict[str, float]:
    """Matmul FLOPs of one GPT-2 forward pass (2 per multiply-add), by part.

    linear:    per token and layer, W_Q, W_K, W_V, W_O (4 d_model^2) and W_in, W_out
               (2 d_model d_mlp) multiply-adds;
    unembed:   d_model d_vocab multiply-adds per token;
    attention: q k^T and pattern v, d_model multiply-adds per (query, key) pair each,
               counting only the pairs the causal mask keeps: pos (pos + 1) / 2.
    LayerNorm, GELU, softmax and the adds are left out: they are memory-bound and small,
    so the total is a lower bound on the work.
    """
    tokens = batch * pos
    linear = 2 * tokens * n_layers * (4 * d_model * d_model + 2 * d_model * d_mlp)
    unembed = 2 * tokens * d_model * d_vocab
    attention = 2 * 2 * n_layers * batch * d_model * pos * (pos + 1) / 2
    return {
        "linear": float(linear),
        "unembed": float(unembed),
        "attention": float(attention),
        "total": float(linear + unembed + attention),
    }


def matmul_roofline(device: str = "cpu", repeats: int = 3) -> tuple[float, list[dict[str, Any]]]:
    """The machine's fp32 matmul rate, measured now: the best GFLOP/s over GPT-2-sized
    products (an MLP input, an MLP output and an unembedding of 512 tokens).

    Returns (best GFLOP/s, one row per shape with its best rate).
    """
    shapes = [(512, 768, 3072), (512, 3072, 768), (512, 768, 50257)]
    rows = []
    gen = torch.Generator().manual_seed(0)
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen).to(device)
        b = torch.randn(k, n, generator=gen).to(device)
        out = torch.empty(m, n, device=device)
        torch.matmul(a, b, out=out)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            synchronize(device)
            t0 = time.perf_counter()
            torch.matmul(a, b, out=out)
            synchronize(device)
            best = min(best, time.perf_counter() - t0)
        rows.append({"shape": f"[{m}x{k}]@[{k}x{n}]", "gflops": 2 * m * k * n / best / 1e9})
        del a, b, out
    return max(r["gflops"] for r in rows), rows


# ----------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------
def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_time(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "n/a"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"
