"""`ActivationStore`: text -> tokens -> activations at chosen hooks -> mixed batches or shards.

The forward pass is the model's own `run_with_cache` with `names_filter` set to the hooks and
`stop_at_layer` just past the last of them, so a store for `blocks.3.attn.hook_z` of a 12-layer
model runs 4 blocks, and one for `blocks.3.hook_resid_pre` 3 (that stream is what the forward
returns when it stops at layer 3; sae-lens runs one block more). Each hook's activation `[batch, pos, ...]` becomes rows
`[batch * pos, d_in]` (per-head hooks such as `hook_z` are flattened, as sae-lens does).

    >>> store = ActivationStore(model, "blocks.1.hook_resid_pre", "data/corpus", context_size=128)
    >>> x = store.next_batch()                 # [4096, d_model], mixed across ~buffer_rows rows
    >>> for x in store: ...                    # until the data runs out
    >>> store.harvest("acts/", n_tokens=10**6)  # or to safetensors shards (see harvest.py)
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator, Iterator
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_int_in_range
from ..utils import hook_shape
from .buffer import MixingBuffer
from .text import TokenWindows

__all__ = ["ActivationStore"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
_NOT_PER_TOKEN = ("hook_pattern", "hook_attn_scores")


def _dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in _DTYPES.values():
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ValueError(f"dtype={value!r}: expected one of {', '.join(_DTYPES)} (or the torch dtype)")


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ActivationStore:
    """Stream `data` through `model` and serve the activations at `hooks` as row batches.

    Args:
        model: a `GPT` (anything with `run_with_cache`, `hook_points`, `cfg` and `tokenizer`).
        hooks: a hook name (batches are then tensors `[n, d_in]`) or a list of names (dicts of them).
        data: a folder of .txt files, a file, a list of paths, or any iterable of strings (documents).
        context_size: tokens per window (default: the model's n_ctx).
        batch_size: windows per forward pass.
        buffer_rows: the most rows the mixing buffer holds (default: 16 forward passes' worth, and at
            least two output batches); memory is `buffer_rows x sum(d_in) x dtype size`.
        out_batch_size: rows per `next_batch()`.
        shuffle: mix rows across the buffer (False: rows come out in data order, window by window).
        dtype: of the served activations (default: the model's).
        device: of the served activations (default: the model's).
        prepend_bos: start every window with BOS (default: `cfg.default_prepend_bos`).
        rank: with `world_size`, read windows `rank, rank + world_size, ...` only (default: from
            torch.distributed when it is initialised, else the whole data). `harvest` with
            world_size > 1 needs the process group (the ranks write one manifest through it).
        world_size: the number of ranks (see `rank`).

    The data is read and tokenized by a thread ahead of the forward passes; it stops when the data runs
    out, on `close()`, or on leaving `with ActivationStore(...) as store:`.

    Example:
        >>> store = ActivationStore(model, "blocks.1.hook_resid_pre", ["some text " * 100], context_size=8,
        ...                         out_batch_size=64)
        >>> store.next_batch().shape        # tiny-gpt2: d_model 128
        torch.Size([64, 128])
    """

    def __init__(
        self,
        model: Any,
        hooks: str | list[str],
        data: Any,
        *,
        context_size: int | None = None,
        batch_size: int = 8,
        buffer_rows: int | None = None,
        out_batch_size: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        prepend_bos: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        progress: bool = False,
    ) -> None:
        if not (hasattr(model, "run_with_cache") and hasattr(model, "hook_points") and hasattr(model, "cfg")):
            raise TypeError(f"model must be a GPT (with run_with_cache and hook points), got {type(model).__name__}")
        if getattr(model, "tokenizer", None) is None:
            raise ValueError("model has no tokenizer: the store turns text into tokens with model.tokenizer")
        self.model, self.cfg = model, model.cfg
        self.single = isinstance(hooks, str)
        if not isinstance(hooks, (str, list, tuple)):
            raise TypeError(f"hooks must be a hook name or a list of names, got {type(hooks).__name__}")
        names = [hooks] if isinstance(hooks, str) else list(hooks)
        if not names:
            raise ValueError("hooks: expected a hook name or a non-empty list of names, got []")
        try:
            self.hooks = [hp.name for hp in model.hook_points(names, arg="hooks")]
        except KeyError as e:
            raise KeyError(f"hooks: {e.args[0]}") from None
        for name in self.hooks:
            if name.endswith(_NOT_PER_TOKEN):
                raise ValueError(
                    f"hooks: {name!r} is [batch, head, query_pos, key_pos], not one vector per token; "
                    "the store takes per-token activations (resid, attn_out, mlp_out, hook_z, ...)"
                )
        n_ctx = self.cfg.n_ctx
        self.prepend_bos = bool(self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos)
        low = 2 if self.prepend_bos else 1
        self.context_size = n_ctx if context_size is None else context_size
        self.context_size = check_int_in_range(
            self.context_size, "context_size", low, n_ctx, f"contexts of {self.cfg.model_name or 'the model'}"
        )
        self.batch_size = check_int_in_range(batch_size, "batch_size", 1, None)
        self.out_batch_size = check_int_in_range(out_batch_size, "out_batch_size", 1, None)
        forward_rows = self.batch_size * self.context_size
        default_rows = max(16 * forward_rows, 2 * self.out_batch_size)
        self.buffer_rows = check_int_in_range(
            default_rows if buffer_rows is None else buffer_rows, "buffer_rows", forward_rows, None,
            f"buffer_rows (at least one forward pass, batch_size x context_size = {forward_rows})",
        )  # fmt: skip
        self.shuffle, self.seed, self.progress = bool(shuffle), int(seed), progress
        self.dtype = model.W_E.dtype if dtype is None else _dtype(dtype)
        self.device = torch.device(device) if device is not None else model.W_E.device
        dist_rank, dist_world = _dist_rank_world()
        self.world_size = check_int_in_range(dist_world if world_size is None else world_size, "world_size", 1, None)
        self.rank = check_int_in_range(dist_rank if rank is None else rank, "rank", 0, self.world_size - 1)
        self.data = data
        self.windows = TokenWindows(model.tokenizer, data, self.context_size, self.prepend_bos)
        self.stop_at_layer = self._stop_layer()
        self.d_in = self._widths()
        self.buffer = MixingBuffer(self.buffer_rows, self.d_in, self.dtype, self.device, self.shuffle, self.seed)
        self._batches: Generator[Tensor, None, None] | None = None
        self.exhausted = False
        self.n_tokens_seen = 0
        self._bar: Any = None

    # ----- the forward pass ------------------------------------------------
    def _stop_layer(self) -> int | None:
        """The first layer no hook needs: blocks.L.* needs L + 1 blocks, except blocks.L.hook_resid_pre,
        which is what `stop_at_layer=L` returns (so it needs L); embeddings need none; ln_final /
        unembed need them all (None: run to the end, return_type=None)."""
        stop = 0
        for name in self.hooks:
            m = re.match(r"blocks\.(\d+)\.(hook_resid_pre$)?", name)
            if m:
                stop = max(stop, int(m.group(1)) + (0 if m.group(2) else 1))
            elif not name.startswith(("hook_embed", "hook_pos_embed", "hook_tokens")):
                return None
        return stop

    def activations(self, tokens: Tensor) -> dict[str, Tensor]:
        """Each hook's activation on `tokens` `[batch, pos]` as rows `[batch * pos, d_in]`.

        `run_with_cache` with `names_filter` (the hooks) and `stop_at_layer`; `blocks.S.hook_resid_pre`
        at the stop layer S is the forward's own output (the residual stream entering S), so a store
        of resid_pre alone is one plain forward through the first S blocks.

        Example:
            >>> store.activations(torch.tensor([[2047, 5, 6]]))["blocks.1.hook_resid_pre"].shape
            torch.Size([3, 128])
        """
        tokens = tokens.to(self.model.W_E.device)
        stop = self.stop_at_layer
        at_stop = f"blocks.{stop}.hook_resid_pre"
        cached = [h for h in self.hooks if h != at_stop]
        n = tokens.shape[0] * tokens.shape[1]
        with torch.inference_mode():
            if not cached:
                acts = {at_stop: self.model(tokens, stop_at_layer=stop)}
            elif stop is None:
                acts = dict(self.model.run_with_cache(tokens, names_filter=cached, return_type=None)[1].items())
            else:
                resid, cache = self.model.run_with_cache(tokens, names_filter=cached, stop_at_layer=stop)
                acts = {**dict(cache.items()), at_stop: resid}
            return {name: acts[name].reshape(n, -1).to(device=self.device, dtype=self.dtype) for name in self.hooks}

    def _widths(self) -> dict[str, int]:
        # the hooks were checked to hold one vector per token: a shape, never None
        return {name: math.prod(hook_shape(self.cfg, name) or ()) for name in self.hooks}

    def window_batches(self) -> Generator[tuple[Tensor, Tensor], None, None]:
        """`(window_ids, tokens)`: this rank's windows (global indices `rank, rank + world_size, ...`)
        in batches of `batch_size`; the last batch may be smaller."""
        ids: list[int] = []
        rows: list[Tensor] = []
        windows = iter(self.windows)
        try:
            for i, w in enumerate(windows):
                if i % self.world_size != self.rank:
                    continue
                ids.append(i)
                rows.append(w)
                if len(rows) == self.batch_size:
                    yield torch.tensor(ids), torch.stack(rows)
                    ids, rows = [], []
            if rows:
                yield torch.tensor(ids), torch.stack(rows)
        finally:
            windows.close()  # stops and joins the reading thread, also when the consumer stops early

    # ----- in memory -------------------------------------------------------
    def _refill(self) -> None:
        if self._batches is None:
            self._batches = self._tokens()
            if self.progress:
                self._bar = tqdm(desc="activations", unit="tok", unit_scale=True, disable=self.rank != 0)
        forward_rows = self.batch_size * self.context_size
        while not self.exhausted and self.buffer.room >= forward_rows:
            tokens = next(self._batches, None)
            if tokens is None:
                self.exhausted = True
                if self.n_tokens_seen == 0:
                    raise ValueError(
                        f"data: no window of context_size={self.context_size} tokens could be made from it "
                        "(empty, or shorter than one window)"
                    )
                break
            self.buffer.put(self.activations(tokens))
            self.n_tokens_seen += tokens.numel()
            if self._bar is not None:
                self._bar.update(tokens.numel())

    def _tokens(self) -> Generator[Tensor, None, None]:
        batches = self.window_batches()
        try:
            for _, tokens in batches:
                yield tokens
        finally:
            batches.close()

    def close(self) -> None:
        """Stop reading the data: the reading thread is stopped and joined (a store used up, or dropped,
        does this by itself; `with ActivationStore(...) as store:` calls it on leaving)."""
        if self._batches is not None:
            self._batches.close()
        if self._bar is not None:
            self._bar.close()
        self.exhausted = True

    def __enter__(self) -> ActivationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_batch(self) -> Tensor | dict[str, Tensor]:
        """The next `out_batch_size` rows (fewer at the very end): a tensor `[n, d_in]` for a single hook,
        else a dict hook -> tensor. Raises StopIteration when the data and the buffer are spent.

        Example:
            >>> x = store.next_batch()      # [4096, 128] for blocks.1.hook_resid_pre of tiny-gpt2
        """
        low = self.buffer_rows // 2 if self.shuffle else self.out_batch_size
        if len(self.buffer) < max(low, self.out_batch_size) and not self.exhausted:
            self._refill()
        if len(self.buffer) == 0:
            if self._bar is not None:
                self._bar.close()
            raise StopIteration
        out = self.buffer.take(self.out_batch_size)
        return out[self.hooks[0]] if self.single else out

    def __iter__(self) -> Iterator[Tensor | dict[str, Tensor]]:
        while True:
            try:
                yield self.next_batch()
            except StopIteration:
                return

    # ----- to disk ---------------------------------------------------------
    def harvest(self, out_dir: Any, n_tokens: int, shard_tokens: int = 1 << 20, **kwargs: Any) -> dict[str, Any]:
        """Write `n_tokens` tokens' activations to safetensors shards in `out_dir` (see `harvest.harvest`).

        Example:
            >>> manifest = store.harvest("acts/", n_tokens=4096, shard_tokens=2048)
        """
        from .harvest import harvest

        return harvest(self, out_dir, n_tokens, shard_tokens, **kwargs)
