"""`estimate_memory`: the peak memory an `attribute` call will take, before running it, part by part.

Each part is what attribute.py allocates, phase by phase (sizes in bytes; B the batch size, P the prompt's
positions, L layers, d d_model, H heads, F each layer's d_sae, A the active features, N the graph's nodes):

    weights        the model's parameters and the transcoders' resident ones (a lazily loaded matrix: none)
    forward        the replacement model's graph of one copy of the prompt, kept for the backward passes
                   (one graph at a time: replacement.Prefixes): per layer 5 P d values (residual, LayerNorm
                   outputs, keys, values, z) and the attention pattern H P^2, plus 3 P d (embeddings,
                   ln_final) and the value weights side by side (d^2 a layer)
    features       the active features' indices and values, the error vectors [L, P, d] and the logits
                   [P, d_vocab] (the dense activations [L, P, F] live in phase 1 only: see transient)
    encoder_rows   [A, d_in]: each active feature's encoder row (phase 4's injections)
    decoder_rows   each active feature's scaled decoder rows (a CLT's into every later layer too) and the
                   per-batch buffer of their dot products [B, rows]
    adjacency      dense [N, N] (every feature a node), the visited rows plus the assembled graph (a subset),
                   or the CSR matrix of the causal cones' non-zeros (sparse.py)
    transient      the largest short-lived piece beyond those: phase 1's dense activations [L, P, F] (the list
                   and its stack) with one layer's encoder read from a lazily loaded file; one backward pass
                   batched over the B targets (gradients at every layer, [B, P, d] each, the cotangents, and
                   the batch's rows); the influence ranking
                   (two copies of the visited rows); the assembly; and 4 MiB of small objects

`total` is their sum. The active features are predicted: a TopK transcoder has k per position (the BOS's
zeroed); others need `features_per_token` (their L0). `attribute(check_memory=True)` refuses, before any
work, a run whose estimate exceeds the memory available (Linux's MemAvailable; on CUDA, the free device
memory for the parts there), naming a `batch_size` and a `max_feature_nodes` that fit.

Example:
    >>> from interp_gpt import GPT
    >>> from interp_gpt.sae.training import shipped_transcoders
    >>> model = GPT.from_pretrained("tiny-gpt2")
    >>> est = estimate_memory(model, shipped_transcoders(model), prompt_length=9, features_per_token=20)
    >>> est.total == sum(est.parts().values())
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..checks import check_int_in_range
from ..sae.mapped import file_weight
from ._inputs import bos_positions, check_transcoders
from .replacement import Readers
from .sparse import cone_nonzeros, csr_bytes

__all__ = ["MemoryEstimate", "available_bytes", "estimate_memory"]

_GiB = 2**30
_RUNTIME = 4 * 2**20  # Python's and the allocator's small objects of a call (measured: a few MiB)


@dataclass(frozen=True)
class MemoryEstimate:
    """The peak memory of an `attribute` call, in bytes, part by part (see the module's docs); `total` is
    the sum, `work` what the call adds to the weights already held. `n_features`: the active features
    predicted, `n_nodes` the graph's nodes, `sparse` the adjacency's layout, `device_parts` the parts held
    on the model's device (the rest on the host: the adjacency and the rows are built there)."""

    weights: int
    forward: int
    features: int
    encoder_rows: int
    decoder_rows: int
    adjacency: int
    transient: int
    n_features: int
    n_nodes: int
    batch_size: int
    sparse: bool
    device: str
    device_parts: tuple[str, ...]

    _PARTS = ("weights", "forward", "features", "encoder_rows", "decoder_rows", "adjacency", "transient")

    def parts(self) -> dict[str, int]:
        """{part: bytes}, in the order memory fills."""
        return {name: int(getattr(self, name)) for name in self._PARTS}

    @property
    def total(self) -> int:
        """The estimated peak: every part."""
        return sum(self.parts().values())

    @property
    def work(self) -> int:
        """What the call adds to the memory in use before it: every part but the weights."""
        return self.total - self.weights

    def on_device(self) -> int:
        """The work held on the model's device (all of it on the CPU)."""
        return sum(v for k, v in self.parts().items() if k in self.device_parts and k != "weights")

    def __str__(self) -> str:
        rows = [f"{k:>13}  {v / 2**20:10.1f} MiB" for k, v in self.parts().items()]
        layout = "sparse" if self.sparse else "dense"
        head = f"attribute's peak memory: {self.total / 2**20:.1f} MiB ({self.work / 2**20:.1f} MiB over the weights)"
        tail = f"{self.n_features} active features, {self.n_nodes} nodes, {layout}, batch_size={self.batch_size}"
        return "\n".join([head, *rows, tail])


def available_bytes(device: Any = "cpu") -> int | None:
    """The memory available now: Linux's MemAvailable for the CPU, the free memory of a CUDA device
    (torch.cuda.mem_get_info); None where it cannot be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(dev)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def estimate_memory(
    model: Any,
    transcoders: Any,
    prompt_length: int,
    *,
    batch_size: int | None = None,
    max_feature_nodes: int | None = None,
    sparse: bool | None = None,
    max_n_logits: int = 10,
    features_per_token: int | None = None,
) -> MemoryEstimate:
    """The peak memory `attribute(model, prompt, transcoders, ...)` will take for a prompt of
    `prompt_length` tokens (the BOS included), with the same `batch_size` (None: attribute's default),
    `max_feature_nodes`, `sparse` (None: dense where it fits the memory available now, as attribute
    decides) and `max_n_logits` (the most logit targets). `features_per_token`: the active features per
    token of every layer (None: a TopK transcoder's k; others need it: their L0). See the module's docs.

    Example:
        >>> est = estimate_memory(model, tcs, 9, batch_size=16, features_per_token=20)   # tiny-gpt2's transcoders
        >>> est.total == sum(est.parts().values())    # bytes at the peak, weights included; print(est): in MiB
        True
    """
    caller = "estimate_memory"
    readers = check_transcoders(model, transcoders, caller)
    return estimate_for(
        model, readers, prompt_length, batch_size, max_feature_nodes, sparse, max_n_logits, features_per_token, caller
    )


def estimate_for(
    model: Any,
    readers: Readers,
    prompt_length: Any,
    batch_size: Any,
    max_feature_nodes: Any,
    sparse: Any,
    max_n_logits: Any,
    features_per_token: Any,
    caller: str,
    n_active: int | None = None,
) -> MemoryEstimate:
    """`estimate_memory` on checked transcoders (`n_active`: the active features where known)."""
    cfg = model.cfg
    check_int_in_range(prompt_length, "prompt_length", 1, None, caller=caller)
    if prompt_length > cfg.n_ctx:
        raise ValueError(
            f"{caller}: prompt_length={prompt_length} is longer than the model's context, n_ctx={cfg.n_ctx}"
        )
    device = model.W_E.device
    if batch_size is None:
        batch_size = 16 if device.type == "cpu" else 128
    check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    if max_feature_nodes is not None:
        check_int_in_range(max_feature_nodes, "max_feature_nodes", 1, None, caller=caller)
    check_int_in_range(max_n_logits, "max_n_logits", 1, None, caller=caller)
    if sparse is not None and not isinstance(sparse, bool):
        raise TypeError(f"{caller}: sparse={sparse!r}: expected True, False or None")
    shapes = _Shapes(model, readers)
    zeroed = len(range(prompt_length)[bos_positions(model)])
    if n_active is None:
        per_token = features_per_token if features_per_token is not None else shapes.k
        if per_token is None:
            raise ValueError(
                f"{caller}: features_per_token=None: the transcoders are {shapes.arch}, not TopK: pass the mean "
                "number of active features per token of a layer (their L0)"
            )
        check_int_in_range(per_token, "features_per_token", 0, shapes.d_sae, caller=caller)
        n_active = per_token * (prompt_length - zeroed) * cfg.n_layers
    n_keep = n_active if max_feature_nodes is None else min(max_feature_nodes, n_active)
    return _estimate(shapes, prompt_length, batch_size, n_active, n_keep, max_n_logits, sparse, zeroed)


class _Shapes:
    """What the estimate reads off the model and the transcoders."""

    def __init__(self, model: Any, readers: Readers):
        cfg = model.cfg
        self.L, self.d, self.H, self.dh, self.V = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab
        self.m = model.W_E.element_size()
        self.device = str(model.W_E.device)
        self.model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        module = readers.clt if readers.clt is not None else readers.plts[0]  # type: ignore[index]
        c = module.cfg  # type: ignore[union-attr]
        self.arch, self.k, self.d_sae, self.d_in = (
            c.architecture,
            c.k if c.architecture == "topk" else None,
            c.d_sae,
            c.d_in,
        )
        self.t = readers.dtype.itemsize
        self.clt = readers.clt is not None
        mods = [readers.clt] if readers.clt is not None else list(readers.plts or [])
        self.tc_bytes = 0
        for mod in mods:
            for name, p in mod.named_parameters():  # type: ignore[union-attr]
                if file_weight(mod, name) is None:
                    self.tc_bytes += p.numel() * p.element_size()
        self.lazy_enc = readers.file(0, "W_enc")
        self.lazy_dec = readers.file(0, "W_dec") is not None


def _estimate(
    s: _Shapes, P: int, B: int, n_active: int, n_keep: int, n_logits: int, sparse: bool | None, zeroed: int
) -> MemoryEstimate:
    L, d, H, dh, m, t = s.L, s.d, s.H, s.dh, s.m, s.t
    n_fixed = (L + 1) * P
    N = n_active + n_fixed + n_logits
    direct = n_keep == n_active
    # forward: what autograd keeps of the graph of one copy (counted with saved-tensor hooks)
    forward = m * (5 * L * P * d + L * H * P * P + 3 * P * d + L * d * H * dh + 2 * L * P)
    forward += L * P * P  # the causal masks
    features = 28 * n_active + L * P * d * m + P * s.V * m
    encoder_rows = n_active * s.d_in * t
    n_dec = n_active * (L + 1) // 2 if s.clt else n_active  # a CLT's feature writes into its layer and later
    decoder_rows = n_dec * d * t + 4 * B * n_dec
    dense = 4 * N * N if direct else 4 * ((n_keep + n_logits) * N + (n_keep + n_fixed + n_logits) ** 2)
    small = None
    if direct:
        per_pos = n_active // max(L * (P - zeroed), 1)
        cells = torch.cartesian_prod(torch.arange(L), torch.arange(zeroed, P)) if P > zeroed else torch.zeros(0, 2)
        active = cells.long().repeat_interleave(per_pos, dim=0)
        small = csr_bytes(cone_nonzeros(active, L, P, n_logits), N)
    if sparse is None:
        free = available_bytes()
        sparse = small is not None and free is not None and dense > free
    as_sparse = bool(sparse) and small is not None
    adjacency = small if as_sparse and small is not None else dense
    backward = m * (2 * L + 5) * B * P * d + 4 * B * (n_active + n_fixed) + (17 * B * N if as_sparse else 0)
    influence = 0 if direct else 8 * (n_keep + n_logits) * N
    assembly = 0 if direct else 4 * n_keep * N
    lazy_read = 0
    if s.lazy_enc is not None:  # phase 1: one layer's encoder read through its own map (a copy where transposed)
        lazy_read = s.d_in * s.d_sae * t * (2 if s.lazy_enc.transposed else 1)
    # phase 1's peak and the decoder rows' (a copy while sorted), over what is held later
    # phase 1's reconstructions from lazily loaded decoders: a layer's (a CLT's: a slice's pages, one a row)
    recon_read = s.d_sae * (d * t + (4096 if s.clt else 0)) if s.lazy_dec else 0
    dense_acts = L * P * s.d_sae * t  # phase 1: the list, one more layer's pre-activations, then the stack
    phase1 = max(dense_acts + 2 * P * s.d_sae * t + lazy_read, dense_acts + recon_read, 2 * dense_acts)
    early = max(phase1 - (encoder_rows + decoder_rows + adjacency), n_dec * d * t - (encoder_rows + adjacency))
    # phase 4's encoder columns from a lazily loaded file in sae-lens' layout [d_in, d_sae]: every page of a layer
    columns = s.d_in * s.d_sae * t if s.lazy_enc is not None and not s.lazy_enc.transposed else 0
    transient = max(backward, influence, assembly, early, columns, 0) + _RUNTIME
    weights = s.model_bytes + s.tc_bytes
    on_device = ("weights", "forward", "features", "encoder_rows", "decoder_rows")
    return MemoryEstimate(
        weights=weights,
        forward=forward,
        features=features,
        encoder_rows=encoder_rows,
        decoder_rows=decoder_rows,
        adjacency=adjacency,
        transient=transient,
        n_features=n_active,
        n_nodes=n_keep + n_fixed + n_logits,
        batch_size=B,
        sparse=as_sparse,
        device=s.device,
        device_parts=on_device,
    )


def refuse_if_short(
    model: Any,
    readers: Readers,
    n_pos: int,
    batch_size: int,
    max_feature_nodes: int | None,
    sparse: bool | None,
    n_logits: int,
    caller: str,
) -> MemoryEstimate | None:
    """`attribute(check_memory=True)`'s check before any work: refuse, naming a `batch_size` and a
    `max_feature_nodes` that fit, a run whose estimate exceeds the memory available (the active features
    of a transcoder not TopK are unknown yet: counted as none; attribute checks the adjacency again after the
    forward pass)."""
    shapes = _Shapes(model, readers)
    zeroed = len(range(n_pos)[bos_positions(model)])
    n_active = (shapes.k or 0) * (n_pos - zeroed) * shapes.L

    def est(batch: int, nodes: int | None) -> MemoryEstimate:
        n_keep = n_active if nodes is None else min(nodes, n_active)
        return _estimate(shapes, n_pos, batch, n_active, n_keep, n_logits, sparse, zeroed)

    first = est(batch_size, max_feature_nodes)
    if fits(first):
        return first
    batch = _largest(lambda b: fits(est(b, max_feature_nodes)), batch_size)
    nodes = _largest(lambda n: fits(est(batch_size, n)), max_feature_nodes or n_active)
    both = _largest(lambda n: fits(est(1, n)), max_feature_nodes or n_active)
    options = []
    if batch:
        options.append(f"batch_size={batch}")
    if nodes:
        options.append(f"max_feature_nodes={nodes}")
    if not options and both:
        options.append(f"batch_size=1 with max_feature_nodes={both}")
    advice = " or ".join(options) if options else "a shorter prompt (no batch_size or max_feature_nodes fits)"
    need, free = _short(first)
    parts = ", ".join(f"{k} {_size(v)}" for k, v in first.parts().items() if k != "weights")
    raise ValueError(
        f"{caller}: this run needs about {_size(need)} ({first.n_features} active features, batch_size={batch_size}, "
        f"max_feature_nodes={max_feature_nodes}) and {_size(free)} are available: pass {advice}, or "
        f"check_memory=False to run anyway (the estimate: {parts})"
    )


def _size(n: int) -> str:
    return f"{n / _GiB:.2f} GiB" if n >= _GiB else f"{n / 2**20:.1f} MiB"


def fits(est: MemoryEstimate) -> bool:
    """Whether `est`'s work fits the memory available now (True where that cannot be read)."""
    return _short(est)[0] <= _short(est)[1]


def _short(est: MemoryEstimate) -> tuple[int, int]:
    """(bytes needed, bytes available) on the side that is shorter: the device, or the host."""
    host_free = available_bytes()
    host_need = est.work - (est.on_device() if not est.device.startswith("cpu") else 0)
    pairs = [(host_need, host_free)]
    if not est.device.startswith("cpu"):
        pairs.append((est.on_device(), available_bytes(est.device)))
    known = [(need, free) for need, free in pairs if free is not None]
    if not known:
        return 0, 1
    return max(known, key=lambda p: p[0] - p[1])


def _largest(ok: Any, high: int) -> int | None:
    """The largest n in 1..high with ok(n) (ok grows false as n grows), or None."""
    if high < 1 or not ok(1):
        return None
    lo, hi = 1, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo
