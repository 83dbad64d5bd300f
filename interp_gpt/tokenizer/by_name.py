"""A tokenizer by name, as transformer-lens loads `cfg.tokenizer_name` when a model is built from a config.

`GPT(Config(..., tokenizer_name=NAME))` attaches `tokenizer_by_name(NAME)`. NAME is looked up in this order:

1. a shipped model's name ("tiny-gpt2"): its own tokenizer;
2. one of GPT-2's names ("gpt2", "gpt2-medium" ...): GPT-2's BPE, found as `gpt2_tokenizer()` finds it;
3. a local folder: a tokenizer `Tokenizer.save` wrote, or Hugging Face's files (`tokenizer.json`, or what
   `transformers` reads, such as `vocab.json` + `merges.txt`);
4. a Hugging Face hub id ("EleutherAI/gpt-neox-20b"): its tokenizer files from the local Hugging Face cache,
   or, unless HF_HUB_OFFLINE is set, from the hub (as transformer-lens' `AutoTokenizer.from_pretrained` does).

The ids of bos, eos and pad come from the tokenizer's own config, with transformer-lens' defaults: no eos ->
"<|endoftext|>", no pad -> eos, no bos -> eos. A `tokenizer.json` is read with `tokenizers` (a core
dependency); only a folder without one needs `transformers` (the `compare` extra, imported here lazily).
A name found nowhere is a `ValueError` naming it and the places looked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import tokenizers

from ..checkpoints.sources import shipped_models
from ..config import PRESETS
from .bpe import ENDOFTEXT, Tokenizer, gpt2_tokenizer, saved_tokenizer

__all__ = ["tokenizer_by_name"]

# GPT-2's five checkpoints share one tokenizer (transformer-lens' configs name each model's own).
_GPT2_NAMES = {*PRESETS, *(f"openai-community/{name}" for name in PRESETS), "gpt2-small"}
# What a hub repo's tokenizer may consist of (fetched from the cache or the hub; weights are never fetched).
_TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "vocab.txt",
    "added_tokens.json",
]


def tokenizer_by_name(name: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer `name` stands for: a shipped model's, GPT-2's, a folder's, or a hub repo's (from the
    local Hugging Face cache first). See the module docstring for the order.

    Example:
        >>> tokenizer_by_name("tiny-gpt2").encode("the cat")
        [422, 280, 294]
        >>> GPT(Config(n_layers=1, d_model=8, n_heads=2, d_vocab=50257, n_ctx=16, tokenizer_name="gpt2")).tokenizer.name
        'gpt2'
    """
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise TypeError(f"tokenizer_name must be a non-empty str (a hub id or a folder), got {name!r}")
    text = str(name)
    shipped = shipped_models()
    if text in shipped:
        found = saved_tokenizer(shipped[text])
        if found is not None:
            return found
    if text in _GPT2_NAMES:
        return gpt2_tokenizer()
    folder = Path(text).expanduser()
    if folder.is_dir():
        return _from_folder(folder, text)
    if folder.exists():
        raise ValueError(f"tokenizer_name={text!r} is a file; name a folder holding a tokenizer, or a hub id")
    return _from_folder(_hub_folder(text), text)


def _hub_folder(repo_id: str) -> Path:
    """The local folder of `repo_id`'s tokenizer files: the Hugging Face cache, else (unless offline) the hub."""
    from huggingface_hub import constants, snapshot_download

    # huggingface_hub reads HF_HUB_OFFLINE once, at import; honour a later setting too.
    offline = constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    why = ""
    for local_only in [True] if offline else [True, False]:
        try:
            path = snapshot_download(repo_id, allow_patterns=_TOKENIZER_FILES, local_files_only=local_only)
        except Exception as e:  # not cached, no network, no such repo, a malformed id: "not found here"
            why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            continue
        if any((Path(path) / f).is_file() for f in _TOKENIZER_FILES):
            return Path(path)
        why = "the repo holds no tokenizer files"
    where = "the local Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "the Hugging Face cache or the hub"
    raise ValueError(
        f"tokenizer_name={repo_id!r}: no such folder, and no tokenizer for it in {where} ({why}). Download it once "
        f"where there is a network (huggingface-cli download {repo_id} tokenizer.json tokenizer_config.json), "
        "name a folder that holds it, pass tokenizer= to GPT, or set tokenizer_name=None to build without one"
    )


def _from_folder(folder: Path, name: str) -> Tokenizer:
    saved = saved_tokenizer(folder)
    if saved is not None:
        return saved
    specials = _special_tokens(folder)
    if (folder / "tokenizer.json").is_file():
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    else:
        backend = _backend_from_transformers(folder, name)
    return _wrap(backend, specials, name)


def _backend_from_transformers(folder: Path, name: str) -> tokenizers.Tokenizer:
    """The fast backend `transformers` builds from a folder without tokenizer.json (vocab.json + merges.txt ...)."""
    try:
        import transformers  # optional (the `compare` extra): only this kind of folder needs it
    except ImportError:
        raise ValueError(
            f"tokenizer_name={name!r}: {str(folder)!r} has no tokenizer.json, and reading its other tokenizer files "
            "needs transformers (pip install 'interp-gpt[compare]')"
        ) from None
    try:
        hf = transformers.AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    except Exception as e:
        raise ValueError(
            f"tokenizer_name={name!r}: transformers cannot read the tokenizer in {str(folder)!r}: {e}"
        ) from e
    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, tokenizers.Tokenizer):
        raise ValueError(f"tokenizer_name={name!r}: transformers has no fast tokenizer for {str(folder)!r}")
    return tokenizers.Tokenizer.from_str(backend.to_str())  # our own copy


def _special_tokens(folder: Path) -> dict[str, str]:
    """bos / eos / pad as text, from tokenizer_config.json and special_tokens_map.json (the latter wins)."""
    found: dict[str, str] = {}
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / file
        if not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        for key in ("bos_token", "eos_token", "pad_token"):
            value: Any = data.get(key)
            if isinstance(value, dict):  # {"content": "<|endoftext|>", ...}
                value = value.get("content")
            if isinstance(value, str):
                found[key] = value
    return found


def _wrap(backend: tokenizers.Tokenizer, specials: dict[str, str], name: str) -> Tokenizer:
    """Our `Tokenizer` around `backend`, with transformer-lens' defaults for missing special tokens."""

    def token_id(text: str | None) -> int | None:
        return None if text is None else backend.token_to_id(text)

    eos = token_id(specials.get("eos_token", ENDOFTEXT))
    if eos is None:
        raise ValueError(
            f"tokenizer_name={name!r}: the tokenizer names no eos token that its vocabulary holds (transformer-lens "
            f"falls back to {ENDOFTEXT!r}, which it lacks too), so bos, eos and pad have no id"
        )
    pad, bos = token_id(specials.get("pad_token")), token_id(specials.get("bos_token"))
    return Tokenizer(
        backend,
        bos_token_id=eos if bos is None else bos,
        eos_token_id=eos,
        pad_token_id=eos if pad is None else pad,
        name=name,
    )
