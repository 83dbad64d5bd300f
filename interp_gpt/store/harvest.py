"""Harvest activations to safetensors shards: resumable, and split across torch.distributed ranks.

Layout of `out_dir`:

    shard-r000-000000.safetensors   rank 0's first shard: one tensor per hook [rows, d_in] plus `tokens`
                                    [rows] (int32) and `token_index` [rows] (int64: window * context_size + pos)
    progress-r000.json              rank 0's finished shards (written after each; gone at the end)
    manifest.json                   written last, by rank 0 once every rank is done

Window `i` of the data (text.py) goes to rank `i % world_size`, which fills its shards in order. With
`shuffle` a shard's rows are permuted by a generator seeded from (seed, rank, shard), so a harvest killed
half-way resumes after the last shard its progress file records and writes the same bytes; sorting all rows
by `token_index` gives the single-process, unshuffled harvest, whatever the world size. Memory: three
shards' bytes. The phases of `harvest`: 1. every check (settings, process group, folder), before the first
write; 2. the folder and the shards already there; 3. the shards, written by a thread of their own while
the next fills; 4. the manifest: the hooks, d_in, dtype, each shard's sha256, the text's sha256 and the
harvest's identity (settings, model and weights, spliced SAEs, hooks, tokenizer: identity.py). A folder
holding a harvest with another identity is refused, naming what differs; a resume or a finished harvest
also compares the text's sha256. Files are written whole or not at all (`interp_gpt.files`), and every
thread is joined before `harvest` returns or raises.

    >>> harvest(store, "acts/", n_tokens=1_000_000, shard_tokens=65_536)
    >>> acts = load_harvest("acts/")["blocks.1.hook_resid_pre"]
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_int_in_range
from ..files import atomic_path, write_atomic
from .identity import differences, identity
from .shardfile import ShardBuffer

__all__ = ["harvest", "load_harvest", "iter_shards", "FORMAT"]

FORMAT = "interp_gpt.activations/1"
MANIFEST = "manifest.json"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _check_folder(out: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """Refuse a folder that holds something else; return its manifest if the same harvest is complete."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"out_dir: {str(out)!r} is a file; expected a folder (new or holding this harvest)")
    if not out.exists():
        return None
    recorded = [out / MANIFEST] if (out / MANIFEST).exists() else sorted(out.glob("progress-r*.json"))
    for path in recorded:
        try:
            old = json.loads(path.read_text(encoding="utf-8"))["config"]
        except (ValueError, KeyError) as e:
            raise ValueError(f"out_dir: {str(path)!r} is not a harvest record ({e}); choose another folder") from None
        diff = differences(old, config)
        if diff:
            raise ValueError(
                f"out_dir: {str(out)!r} holds a harvest with a different configuration ({'; '.join(diff)}); "
                "choose another folder or delete it"
            )
    if (out / MANIFEST).exists():
        return dict(json.loads((out / MANIFEST).read_text(encoding="utf-8")))
    ours = {p.name for p in out.iterdir() if p.name.startswith(("shard-r", "progress-r", "."))}
    others = sorted(p.name for p in out.iterdir() if p.name not in ours)
    if others:
        raise ValueError(
            f"out_dir: {str(out)!r} is not empty and holds no harvest (found {', '.join(others[:3])}); "
            "choose a new or empty folder"
        )
    return None


def _shard_seed(seed: int, rank: int, shard: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{rank}/{shard}".encode()).digest()[:8], "little") >> 1


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _gather(obj: Any, world_size: int) -> list[Any]:
    if world_size == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def _check_group(rank: int, world: int) -> None:
    """The ranks meet in torch.distributed at the end (rank 0 gathers every rank's shards into the
    manifest): refuse, before anything is read or written, a world the process group does not match."""
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized()
    if world > 1 and not group:
        raise ValueError(
            f"harvest: the store has rank={rank}, world_size={world} but no torch.distributed process group is "
            "initialised, and the ranks gather their shards into one manifest through it; run every rank under "
            "torchrun (or call torch.distributed.init_process_group first), or harvest with world_size=1"
        )
    if group and (dist.get_rank(), dist.get_world_size()) != (rank, world):
        raise ValueError(
            f"harvest: the store has rank={rank}, world_size={world} but the process group has rank "
            f"{dist.get_rank()} of {dist.get_world_size()}; make the store without rank= and world_size= "
            "(under a process group they come from it)"
        )


def _check_ranks(config: dict[str, Any], world: int) -> str:
    """Every rank harvests with the same settings (rank 0's manifest records its own); returns a token
    rank 0 drew, the same on every rank."""
    token = os.urandom(8).hex()
    everyone = _gather((config, token), world)
    for r, (other, _) in enumerate(everyone):
        diff = differences(everyone[0][0], other, there="on rank 0", here=f"on rank {r}")
        if diff:
            raise ValueError(f"harvest: rank {r}'s settings differ from rank 0's ({'; '.join(diff)})")
    return str(everyone[0][1])


def _check_shared_folder(out: Path, rank: int, world: int, token: str) -> None:
    """Every rank sees the files rank 0 writes (the manifest, at the end): one shared folder."""
    marker = out / f".harvest-ranks-{token}"
    if rank == 0:
        write_atomic(marker, "")
    _barrier()
    seen = _gather(marker.exists(), world)
    if rank == 0:
        marker.unlink(missing_ok=True)
    blind = [r for r, s in enumerate(seen) if not s]
    if blind:
        raise ValueError(
            f"out_dir: rank {blind[0]} does not see the files rank 0 writes in {str(out)!r}; every rank needs "
            "the same folder (on a shared file system): rank 0 writes the manifest there and every rank reads it"
        )


def _text_digest(store: Any, n_windows: int) -> str:
    """The sha256 of the text a harvest of `n_windows` windows reads (as far as its loop reads it)."""
    windows = iter(store.windows)
    try:
        for i, _ in enumerate(windows):
            if i >= n_windows:
                break
    finally:
        windows.close()
    return store.windows.digest


def _check_finished(store: Any, out: Path, manifest: dict[str, Any], n_windows: int) -> None:
    """A finished harvest is handed back only for the same text (the settings matched already) and
    with every shard in place."""
    missing = [r["file"] for r in manifest["shards"] if not (out / r["file"]).is_file()]
    if missing:
        raise ValueError(
            f"out_dir: {str(out)!r} holds a finished harvest whose shards {', '.join(missing[:3])} are missing; "
            "delete the folder and harvest again"
        )
    digest = _text_digest(store, n_windows)
    if digest != manifest["data_sha256"]:
        raise ValueError(
            f"data: the text differs from what the finished harvest in {str(out)!r} read (data_sha256: "
            f"{manifest['data_sha256'][:16]}... there, {digest[:16]}... here); harvest it into another folder"
        )


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _columns(store: Any) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    columns: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {h: (store.dtype, (d,)) for h, d in store.d_in.items()}
    return columns | {"tokens": (torch.int32, ()), "token_index": (torch.int64, ())}


def _new_shard(store: Any, rows: int, rank: int, k: int, spare: list[Tensor] | None = None) -> ShardBuffer:
    """Shard `k` of `rank`: each hook's activations, `tokens`, `token_index`; permuted by its own seed.
    Its bytes are a written shard's from `spare` when one is there (a fresh allocation costs page faults)."""
    gen = torch.Generator().manual_seed(_shard_seed(store.seed, rank, k))
    perm = torch.randperm(rows, generator=gen) if store.shuffle else None
    return ShardBuffer(_columns(store), rows, perm, {"format": FORMAT}, spare.pop() if spare else None)


def _staging(store: Any, rows: int, spare: list[Tensor]) -> ShardBuffer:
    """A shard's rows in data order, as they come from the forward passes (the same size as the shard:
    the writer thread permutes them into the shard itself, off the forward's thread)."""
    return ShardBuffer(_columns(store), rows, None, {"format": FORMAT}, spare.pop() if spare else None)


def _add_rows(store: Any, shard: ShardBuffer, window_ids: list[int], tokens: Tensor) -> None:
    """Run the windows `tokens` [batch, ctx] and put their rows in `shard`."""
    cols = store.activations(tokens)
    pos = torch.arange(tokens.shape[1])
    cols["tokens"] = tokens.reshape(-1).to(torch.int32)
    cols["token_index"] = (torch.tensor(window_ids)[:, None] * tokens.shape[1] + pos).reshape(-1)
    shard.add(cols)


def harvest(
    store: Any,
    out_dir: Any,
    n_tokens: int,
    shard_tokens: int = 1 << 20,
    *,
    progress: bool = True,
    on_shard: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Write the activations of the first `n_tokens` tokens of `store`'s data (rounded down to whole
    windows) to shards of `shard_tokens` rows (rounded down to whole windows) in `out_dir`, then
    `manifest.json`; returns the manifest. Run again on the same folder it resumes, or, when complete,
    reads the text again (no forward pass) and returns the manifest if the text is the same. Under
    torchrun each rank writes its own shards; call it on every rank (a store given rank= and world_size=
    needs the process group too: the ranks meet there at the end).

    `on_shard(record)` is called after each shard is on disk and recorded.

    Example:
        >>> store = ActivationStore(model, "blocks.1.hook_resid_pre", "data/corpus", context_size=128)
        >>> manifest = harvest(store, "acts/", n_tokens=4096, shard_tokens=2048)
    """
    # Phase 1: everything the steps up to the manifest need is checked here, before the first read or write.
    ctx = store.context_size
    n_tokens = check_int_in_range(n_tokens, "n_tokens", ctx, None, f"n_tokens (at least one window of {ctx})")
    shard_tokens = check_int_in_range(shard_tokens, "shard_tokens", ctx, None, f"shard_tokens (at least {ctx})")
    if on_shard is not None and not callable(on_shard):
        raise TypeError(f"harvest: on_shard: expected a function of a shard's record, got {type(on_shard).__name__}")
    n_windows, per_shard = n_tokens // ctx, shard_tokens // ctx
    rank, world = store.rank, store.world_size
    _check_group(rank, world)
    out = Path(out_dir)
    config = {**identity(store), "n_tokens": n_tokens, "shard_tokens": shard_tokens}
    token = _check_ranks(config, world) if world > 1 else ""
    done_manifest = _check_folder(out, config)
    if done_manifest is not None:
        _check_finished(store, out, done_manifest, n_windows)
        _barrier()
        return done_manifest
    _barrier()

    # Phase 2: the folder, and this rank's shards an interrupted harvest left
    out.mkdir(parents=True, exist_ok=True)
    if world > 1:
        _check_shared_folder(out, rank, world, token)
    _remove_leftovers(out, rank)
    progress_path = out / f"progress-r{rank:03d}.json"
    records = _resumed_records(out, progress_path)

    # Phase 3: the shards, filled in data order and written by a thread of their own
    run = _Run(store, out, config, records, progress_path, n_windows, per_shard, on_shard)
    local, n_seen = run.fill(progress)

    # Phase 4: the text read as far as it should be, then the manifest (rank 0) that every rank returns
    run.check_read(local, n_seen)
    return _write_manifest(store, out, config, records, exhausted=local + 1 < run.mine)


def _remove_leftovers(out: Path, rank: int) -> None:
    """Delete the temporaries of a killed harvest (this rank's; rank 0: the manifest's and markers too)."""
    leftovers = [f".shard-r{rank:03d}-*.tmp", f".progress-r{rank:03d}.json.*.tmp"] + (
        [".manifest.json.*.tmp", ".harvest-ranks-*"] * (rank == 0)
    )
    for stale in [p for pattern in leftovers for p in out.glob(pattern)]:  # temporaries of a killed harvest
        stale.unlink(missing_ok=True)


def _resumed_records(out: Path, progress_path: Path) -> list[dict[str, Any]]:
    """The records of this rank's shards already on disk (none for a new harvest), each checked by sha256."""
    records: list[dict[str, Any]] = []
    if progress_path.exists():
        records = json.loads(progress_path.read_text(encoding="utf-8"))["shards"]
        for r in records:
            path = out / r["file"]
            if not path.exists() or _sha256_file(path) != r["sha256"]:
                raise ValueError(
                    f"out_dir: shard {str(path)!r} is missing or differs from its record; delete the folder"
                )
    return records


def _differs(out: Path) -> ValueError:
    return ValueError(
        f"data: the text differs from what the interrupted harvest in {str(out)!r} read (sha256 of the text "
        "so far); resume with the same data or choose another folder"
    )


class _Run:
    """Phase 3 of one rank's harvest: its windows read in order into shards, resumed after the `records`
    already on disk; the shards are shuffled, serialised, hashed and written by one thread while the next one
    fills, one at a time, in order, so the progress file only ever lists a prefix of the shards."""

    def __init__(
        self,
        store: Any,
        out: Path,
        config: dict[str, Any],
        records: list[dict[str, Any]],
        progress_path: Path,
        n_windows: int,
        per_shard: int,
        on_shard: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.store, self.out, self.config, self.records, self.progress_path = store, out, config, records, progress_path
        self.n_windows, self.per_shard, self.on_shard = n_windows, per_shard, on_shard
        self.rank, self.world, ctx = store.rank, store.world_size, store.context_size
        self.skip = sum(r["n_tokens"] for r in records) // ctx  # this rank's windows already on disk
        # A last shard cut short: this rank had read all its windows (its digest is the one at the loop's end).
        self.done_before = bool(records) and records[-1]["n_tokens"] < per_shard * ctx
        self.mine = len(range(self.rank, n_windows, self.world))
        self.pending: list[Future[None]] = []
        self.spare: list[Tensor] = []  # the bytes of shards on disk, for the next ones

    def _write(self, staged: ShardBuffer, k: int, first: int, digest: str) -> None:
        # the shard, permuted by its seed; the last one, cut short, is a file of its own size
        store, rank, spare, records = self.store, self.rank, self.spare, self.records
        shard = _new_shard(store, staged.n, rank, k, spare if staged.n == staged.rows else None)
        shard.add(staged.in_data_order())
        spare.append(staged.buf)
        name = f"shard-r{rank:03d}-{k:06d}.safetensors"
        data = shard.view()
        with atomic_path(self.out / name) as tmp, open(tmp, "wb") as f:
            f.write(data)
        rec = {"file": name, "rank": rank, "index": k, "n_tokens": shard.n, "first_window": first}
        rec |= {"sha256": hashlib.sha256(data).hexdigest(), "data_sha256": digest}
        records.append(rec)
        write_atomic(self.progress_path, json.dumps({"config": self.config, "shards": records}, indent=1))
        spare.append(shard.buf)
        if self.on_shard is not None:
            self.on_shard(rec)

    def _wait(self) -> None:
        while self.pending:
            self.pending.pop().result()  # a failed write (or on_shard) raises here

    def _finish(self, writer: ThreadPoolExecutor, shard: ShardBuffer, first: int, k: int) -> None:
        self._wait()
        self.pending.append(writer.submit(self._write, shard, k, first, self.store.windows.digest))

    def fill(self, progress: bool) -> tuple[int, int]:
        """Read the windows and write the shards; returns (this rank's last window read, the last window
        index seen), -1 where none."""
        store, rank, world, skip, done_before = self.store, self.rank, self.world, self.skip, self.done_before
        ctx, per_shard, records = store.context_size, self.per_shard, self.records
        bar = _NoBar()
        if progress and rank == 0:  # tqdm shows tokens/s; the other ranks go at the same pace
            bar = tqdm(total=self.mine * ctx, initial=skip * ctx, desc="harvest", unit="tok", unit_scale=True)
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harvest-writer")
        windows = iter(store.windows)
        try:
            shard: ShardBuffer | None = None
            k = len(records)  # the next shard's number
            ids: list[int] = []
            rows: list[Tensor] = []
            first = 0
            local = n_seen = -1
            for i, window in enumerate(windows):
                n_seen = i
                if i >= self.n_windows:
                    break
                if i % world != rank:
                    continue
                local += 1
                if local < skip:
                    if local == skip - 1 and not done_before and store.windows.digest != records[-1]["data_sha256"]:
                        raise _differs(self.out)
                    continue
                if done_before:  # more windows than the harvest had found
                    raise _differs(self.out)
                if shard is None:
                    shard, first = _staging(store, per_shard * ctx, self.spare), i
                ids.append(i)
                rows.append(window)
                full = (local + 1) % per_shard == 0
                if len(rows) == store.batch_size or full:
                    _add_rows(store, shard, ids, torch.stack(rows))
                    bar.update(len(rows) * ctx)
                    ids, rows = [], []
                if full:
                    self._finish(writer, shard, first, k)
                    shard, k = None, k + 1
            if rows:
                assert shard is not None
                _add_rows(store, shard, ids, torch.stack(rows))
                bar.update(len(rows) * ctx)
            if shard is not None and shard.n:
                self._finish(writer, shard, first, k)
            self._wait()
        finally:  # every thread this harvest started is stopped and joined, on success and on error
            windows.close()  # the reading thread
            writer.shutdown(wait=True)  # a shard on its way is finished, even on an error
            bar.close()  # (and tqdm's monitor thread with the last bar)
        return local, n_seen

    def check_read(self, local: int, n_seen: int) -> None:
        """Refuse data that gave no window, or less or other text than the interrupted harvest read."""
        ctx, skip, out = self.store.context_size, self.skip, self.out
        if n_seen < 0:
            raise ValueError(f"data: no window of context_size={ctx} tokens could be made from it (empty or too short)")
        if local + 1 < skip:
            raise ValueError(
                f"data: the text is shorter than what the interrupted harvest in {str(out)!r} read ({local + 1} of "
                f"this rank's windows, {skip} already in shards); resume with the same data or choose another folder"
            )
        if self.done_before and self.store.windows.digest != self.records[-1]["data_sha256"]:
            raise _differs(out)


def _write_manifest(
    store: Any, out: Path, config: dict[str, Any], records: list[dict[str, Any]], exhausted: bool
) -> dict[str, Any]:
    """Rank 0 gathers every rank's shards into the manifest and drops the progress files; every rank
    returns the manifest."""
    rank, world = store.rank, store.world_size
    mine_state = {"shards": records, "data_sha256": store.windows.digest, "exhausted": exhausted}
    everyone = _gather(mine_state, world)
    manifest: dict[str, Any] = {}
    if rank == 0:
        shards = [r for s in everyone for r in s["shards"]]
        manifest = {
            "format": FORMAT,
            "config": config,
            "hooks": store.hooks,
            "d_in": store.d_in,
            "dtype": config["dtype"],
            "n_tokens": sum(r["n_tokens"] for r in shards),
            "data_sha256": everyone[0]["data_sha256"],
            "data_exhausted": any(s["exhausted"] for s in everyone),
            "columns": {"tokens": "int32 token ids", "token_index": "int64 window * context_size + position"},
            "shards": shards,
        }
        write_atomic(out / MANIFEST, json.dumps(manifest, indent=1))
        for p in out.glob("progress-r*.json"):
            p.unlink()
    _barrier()
    if rank != 0:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    return manifest


def iter_shards(out_dir: Any, verify: bool = True) -> Iterator[dict[str, Tensor]]:
    """Each shard of a finished harvest as a dict of tensors, in the manifest's order; with `verify`
    a shard whose sha256 differs from the manifest's is refused by name.

    Example:
        >>> manifest = harvest(store, "acts/", n_tokens=4096, shard_tokens=2048)
        >>> for shard in iter_shards("acts/"):
        ...     x = shard["blocks.1.hook_resid_pre"]
    """
    out = Path(out_dir)
    if not (out / MANIFEST).exists():
        raise FileNotFoundError(f"out_dir: {str(out)!r} has no {MANIFEST} (not a finished harvest)")
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    for rec in manifest["shards"]:
        path = out / rec["file"]
        if verify and _sha256_file(path) != rec["sha256"]:
            raise ValueError(f"{str(path)!r}: sha256 differs from the manifest's; the shard is damaged")
        yield load_file(str(path))


def load_harvest(out_dir: Any, sort: bool = False, verify: bool = True) -> dict[str, Tensor]:
    """A finished harvest's shards joined into one dict of tensors (for harvests that fit in memory);
    with `sort`, rows in data order (by `token_index`), the same whatever the world size or shuffle.

    Example:
        >>> manifest = harvest(store, "acts/", n_tokens=4096, shard_tokens=2048)
        >>> acts = load_harvest("acts/", sort=True)["blocks.1.hook_resid_pre"]    # [n_tokens, d_in]
    """
    shards = list(iter_shards(out_dir, verify))
    joined = {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
    if sort:
        order = torch.argsort(joined["token_index"])
        joined = {k: v[order] for k, v in joined.items()}
    return joined
