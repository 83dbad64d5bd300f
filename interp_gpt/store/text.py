"""Text -> fixed-length token windows, streamed, in one reproducible order.

A *document* is one `.txt` file (a folder's files are read in sorted order) or one string
of an iterable. Documents are tokenized without BOS and joined into one token stream, with
the tokenizer's BOS between documents as a separator; the stream is then cut into windows
of `context_size` tokens. With `prepend_bos` every window starts with BOS followed by the
next `context_size - 1` tokens of the stream (a separator BOS that would land right after
it is skipped, so a window never starts with two). This is what sae-lens' ActivationsStore
does for untokenized text with its defaults (BOS as the batch-begin token and as the
sequence separator). A last window the data cannot fill is dropped.

Files are read in chunks of about 64 Ki characters cut between two newlines of a blank line that has
text on both sides ("X\\n|\\nY"): GPT-2's pre-tokenizer splits there anyway, so the chunked
tokenization equals tokenizing the whole file (the tests check it on the shipped corpora).
Memory stays bounded by one chunk whatever the file size.

    >>> windows = TokenWindows(model.tokenizer, "data/corpus", context_size=128)
    >>> first = next(iter(windows))      # a LongTensor of 128 ids, BOS first
"""

from __future__ import annotations

import atexit
import hashlib
import os
import queue
import re
import threading
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = ["TokenWindows", "describe_data"]

T = TypeVar("T")
CHUNK_CHARS = 1 << 16
PIECES = 8  # pieces per chunk, encoded in one call
_SAFE_CUT = re.compile(r"(?<=\S\n)(?=\n\S)")


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise ValueError(f"data: folder {str(path)!r} holds no .txt file")
        return files
    if path.is_file():
        return [path]
    raise FileNotFoundError(f"data: {str(path)!r} is neither a file nor a folder")


def _sources(data: Any) -> list[Path] | Iterable[Any]:
    """The files `data` names (a path or a list of paths), or the iterable of texts itself."""
    if isinstance(data, (str, os.PathLike)):
        return _files(Path(data))
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, os.PathLike) for d in data):
        return [f for d in data for f in _files(Path(d))]
    if isinstance(data, (bytes, bytearray)) or not isinstance(data, Iterable):
        raise TypeError(
            f"data: expected a folder of .txt files, a file, a list of paths or an iterable of strings; "
            f"got {type(data).__name__}"
        )
    return data


def describe_data(data: Any) -> dict[str, Any]:
    """What a harvest records about its data: the files (name and size) or 'iterable'."""
    src = _sources(data)
    if isinstance(src, list) and all(isinstance(p, Path) for p in src):
        return {"files": [{"name": p.name, "bytes": p.stat().st_size} for p in src]}
    return {"iterable": type(data).__name__}


def _file_chunks(path: Path) -> Iterator[list[str]]:
    """The file's text as lists of about PIECES pieces (one list per chunk read), cut where separate
    tokenizations join to the whole file's."""
    carry = ""
    with open(path, encoding="utf-8") as f:
        while block := f.read(CHUNK_CHARS):
            text = carry + block
            cuts, step = [0], len(text) // PIECES
            for m in _SAFE_CUT.finditer(text, 1):
                if m.start() - cuts[-1] >= step:
                    cuts.append(m.start())
            if len(cuts) == 1:
                carry = text
                continue
            yield [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
            carry = text[cuts[-1] :]
    if carry:
        yield [carry]


def _documents(data: Any) -> Iterator[Iterator[list[str]]]:
    src = _sources(data)
    for i, item in enumerate(src):
        if isinstance(item, Path):
            yield _file_chunks(item)
        elif isinstance(item, os.PathLike):
            yield (c for f in _files(Path(item)) for c in _file_chunks(f))
        elif isinstance(item, str):
            yield iter(([item],))
        else:
            raise TypeError(f"data: item {i} is a {type(item).__name__}; expected a string of text")


class TokenWindows:
    """The data as token windows `[context_size]`, in order; iterate once per `iter()`.

    `digest` is the sha256 (hex) of the text read so far (it depends on the text alone, not on how it
    was cut).
    """

    def __init__(self, tokenizer: Any, data: Any, context_size: int, prepend_bos: bool = True) -> None:
        self.tokenizer, self.data, self.context_size, self.prepend_bos = tokenizer, data, context_size, prepend_bos
        self.bos = int(tokenizer.bos_token_id)
        _sources(data)  # refuse a missing path or a wrong type now, not at the first batch
        self._digest = hashlib.sha256().hexdigest()

    @property
    def digest(self) -> str:
        """The sha256 of the token windows so far (the store's identity check)."""
        return self._digest

    def _encode(self, pieces: list[str]) -> list[list[int]]:
        """Each piece's token ids. A `tokenizers` backend without an alphabet to check (GPT-2's BPE, the
        shipped model's) encodes the pieces in one call that skips the character offsets (about twice
        as fast, and spread over the cores); the results equal `tokenizer.encode`'s (tested)."""
        backend: Any = getattr(self.tokenizer, "backend", None)
        if hasattr(backend, "encode_batch_fast") and getattr(self.tokenizer, "_alphabet", None) is None:
            return [e.ids for e in backend.encode_batch_fast(pieces, add_special_tokens=False)]
        return [self.tokenizer.encode(p) for p in pieces]

    def _stream(self) -> Iterator[tuple[np.ndarray, str]]:
        """Token ids in pieces (each document's chunks, a BOS between documents), each with the sha256
        of the text read up to it."""
        sha = hashlib.sha256()
        first = True
        bos = np.array([self.bos], dtype=np.int64)
        for doc in _documents(self.data):
            sha.update(b"\x00document\x00")
            started = False
            for pieces in doc:
                for p in pieces:
                    sha.update(p.encode("utf-8"))
                digest = sha.hexdigest()
                for ids in self._encode(pieces):
                    if not ids:
                        continue
                    if not started and not first:
                        yield bos, digest
                    started, first = True, False
                    yield np.array(ids, dtype=np.int64), digest

    def _blocks(self) -> Iterator[tuple[Tensor, str]]:
        """The windows `[m, context_size]` each piece of the stream completes (m may be 0), with its digest.
        Cut with numpy in the prefetch thread, so the consumer only hands out rows."""
        body = self.context_size - 1 if self.prepend_bos else self.context_size
        span = np.arange(body)
        pending = np.empty(0, dtype=np.int64)
        for piece, digest in self._stream():
            pending = np.concatenate([pending, piece])
            at, n, starts = 0, len(pending), []
            while True:
                if self.prepend_bos and at < n and pending[at] == self.bos:
                    at += 1  # the window's own BOS stands for the separator
                if n - at < body:
                    break
                starts.append(at)
                at += body
            rows = pending[np.array(starts, dtype=np.int64)[:, None] + span]
            if self.prepend_bos:
                rows = np.concatenate([np.full((len(starts), 1), self.bos, dtype=np.int64), rows], axis=1)
            pending = pending[at:]
            yield torch.from_numpy(rows), digest

    def __iter__(self) -> Generator[Tensor, None, None]:
        """The windows in order. Close the iterator when you stop early (`it.close()`; a `for` loop over a
        dropped iterator does it on garbage collection): that stops and joins the reading thread."""
        self._digest = hashlib.sha256().hexdigest()
        blocks = _prefetch(self._blocks())
        try:
            for rows, digest in blocks:
                self._digest = digest
                yield from rows
        finally:
            blocks.close()


_END = object()
_LIVE: dict[threading.Thread, threading.Event] = {}  # prefetch threads not yet joined, and their stop flags


@atexit.register
def _stop_live_threads() -> None:
    """An iterator its consumer never closed (a store left half-read) still has its thread at exit: stop and
    join it here, so no thread is inside the tokenizer or torch while the interpreter tears down."""
    for thread, stop in list(_LIVE.items()):
        stop.set()
        thread.join(timeout=10)


def _prefetch(items: Iterator[T], depth: int = 2) -> Generator[T, None, None]:
    """`items`, made by a thread that keeps up to `depth` ahead: reading and tokenizing (which let go of
    the GIL) overlap the forward passes. Its errors are raised here. When this generator ends (used up,
    an error, or closed early) the thread is stopped and joined before it returns."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            put(e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the open file of the document being read, in this thread, which reads it

    thread = threading.Thread(target=produce, name="store-tokenizer", daemon=True)
    _LIVE[thread] = stop
    thread.start()
    try:
        while (item := q.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        if thread is not threading.current_thread():  # (a garbage collection may run this anywhere)
            thread.join()
            _LIVE.pop(thread, None)
