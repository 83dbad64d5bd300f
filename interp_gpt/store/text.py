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

import hashlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["TokenWindows", "describe_data"]

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
        self._sha = hashlib.sha256()

    @property
    def digest(self) -> str:
        return self._sha.hexdigest()

    def _encode(self, pieces: list[str]) -> list[list[int]]:
        """Each piece's token ids. A `tokenizers` backend without an alphabet to check (GPT-2's BPE, the
        shipped model's) encodes the pieces in one call that skips the character offsets (about twice
        as fast, and spread over the cores); the results equal `tokenizer.encode`'s (tested)."""
        backend: Any = getattr(self.tokenizer, "backend", None)
        if hasattr(backend, "encode_batch_fast") and getattr(self.tokenizer, "_alphabet", None) is None:
            return [e.ids for e in backend.encode_batch_fast(pieces, add_special_tokens=False)]
        return [self.tokenizer.encode(p) for p in pieces]

    def _stream(self) -> Iterator[list[int]]:
        """Token ids in pieces: each document's chunks, a BOS between documents."""
        first = True
        for doc in _documents(self.data):
            self._sha.update(b"\x00document\x00")
            started = False
            for pieces in doc:
                for p in pieces:
                    self._sha.update(p.encode("utf-8"))
                for ids in self._encode(pieces):
                    if not ids:
                        continue
                    if not started and not first:
                        yield [self.bos]
                    started, first = True, False
                    yield ids

    def __iter__(self) -> Iterator[Tensor]:
        self._sha = hashlib.sha256()
        body = self.context_size - 1 if self.prepend_bos else self.context_size
        bos = torch.tensor([self.bos])
        pending = torch.empty(0, dtype=torch.long)
        at = 0  # the next unused token of `pending`
        for piece in self._stream():
            pending = torch.cat([pending[at:], torch.tensor(piece, dtype=torch.long)])
            at, n = 0, len(pending)
            while True:
                if self.prepend_bos and at < n and int(pending[at]) == self.bos:
                    at += 1  # the window's own BOS stands for the separator
                if n - at < body:
                    break
                ids = pending[at : at + body]
                at += body
                yield torch.cat([bos, ids]) if self.prepend_bos else ids.clone()
