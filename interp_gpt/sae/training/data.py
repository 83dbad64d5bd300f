"""The data an SAE trains on: the train / validation split of a corpus, token windows, endless
activation batches from the activation store, and the SAE and transcoders shipped for tiny-gpt2.

Example:
    >>> train, val = split_corpus("data/corpus")
    >>> x = next(activation_batches(model, "blocks.1.hook_resid_pre", train))   # [4096, d_model]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...checks import check_float, check_text_files
from ..saes.core import SAE
from ..transcoders.clt import CrossLayerTranscoder, load_clt
from ..transcoders.transcoder import Transcoder, load_transcoders

__all__ = [
    "split_corpus",
    "held_out_texts",
    "token_windows",
    "activation_batches",
    "SHIPPED_SAE_DIR",
    "shipped_sae",
    "SHIPPED_TRANSCODERS_DIR",
    "SHIPPED_CLT_DIR",
    "shipped_transcoders",
    "shipped_clt",
]


_WEIGHTS = Path(__file__).resolve().parents[2] / "weights"
SHIPPED_SAE_DIR = _WEIGHTS / "tiny-gpt2-sae"
SHIPPED_TRANSCODERS_DIR = _WEIGHTS / "tiny-gpt2-transcoders"  # per-layer JumpReLU skip transcoders, sae-lens format
SHIPPED_CLT_DIR = _WEIGHTS / "tiny-gpt2-clt"  # a JumpReLU cross-layer transcoder, circuit-tracer's format


def shipped_sae(device: str | torch.device = "cpu") -> SAE:
    """The TopK SAE shipped for tiny-gpt2's `blocks.1.hook_resid_pre` (its metrics: metrics.json beside it).

    Example:
        >>> sae = shipped_sae()
        >>> sae.cfg.hook_name
        'blocks.1.hook_resid_pre'
    """
    return SAE.from_pretrained(SHIPPED_SAE_DIR, device=device)


def shipped_transcoders(model: Any = None, device: str | torch.device = "cpu") -> list[Transcoder]:
    """The per-layer transcoders shipped for tiny-gpt2 (JumpReLU with a skip, one per layer, trained on
    its processed weights; metrics.json beside them). With `model`, checked against it and converted
    exactly if its weights were processed otherwise (see `load_transcoders`).

    Example:
        >>> tcs = shipped_transcoders()
        >>> [tc.input_hook for tc in tcs]
        ['blocks.0.ln2.hook_normalized', 'blocks.1.ln2.hook_normalized']
    """
    return load_transcoders(SHIPPED_TRANSCODERS_DIR, model, device=device)


def shipped_clt(device: str | torch.device = "cpu") -> CrossLayerTranscoder:
    """The cross-layer transcoder shipped for tiny-gpt2 (JumpReLU; layer l's features write into every
    layer >= l; trained on its processed weights; metrics.json beside it).

    Example:
        >>> clt = shipped_clt()
        >>> clt.n_layers, clt.cfg.d_sae
        (2, 1024)
    """
    return load_clt(SHIPPED_CLT_DIR, device=device)


# ----------------------------------------------------------------------------
# data: the train / validation split, token windows, activation batches
# ----------------------------------------------------------------------------
def split_corpus(
    data_dir: str | Path | Sequence[str | Path] = "data/corpus", val_frac: float = 0.1
) -> tuple[list[str], list[str]]:
    """(train texts, validation texts): each text file `data_dir` names (a file, a folder of .txt files
    read in sorted order, or a list of either: `check_text_files`' rule) read as the shipped
    model's training script reads it (byte-order mark dropped, CRLF -> LF) and cut at the first newline
    at or after `1 - val_frac` of its characters; the tail is validation. With the default 0.1 this is
    about the tail the shipped model held out for its own validation (the last 10% of each corpus's tokens).

    Example:
        >>> train, val = split_corpus("data/corpus")
        >>> len(train), len(val)
        (2, 2)
    """
    val_frac = check_float(val_frac, "val_frac", 0.0, 0.5)
    files = check_text_files(data_dir, "data_dir")
    train, val = [], []
    for f in files:
        text = f.read_text(encoding="utf-8").lstrip("\ufeff").replace("\r\n", "\n")
        cut = text.find("\n", int(len(text) * (1 - val_frac)))
        cut = len(text) if cut < 0 else cut + 1
        train.append(text[:cut])
        val.append(text[cut:])
    return train, val


def held_out_texts(paths: str | Path | Sequence[str | Path], arg: str = "paths") -> list[str]:
    """The text to look at features on: each folder's validation tail (its .txt files split as
    `split_corpus` splits them, so an SAE trained on the folder's head never saw it), each file whole.

    Example:
        >>> texts = held_out_texts(["data/corpus", "notes.txt"], "--data")   # 2 tails, then notes.txt
    """
    texts: list[str] = []
    items: list[Any] = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    for item in items:
        files = check_text_files(item, arg)
        if Path(item).expanduser().is_dir():
            texts += split_corpus(files)[1]
        else:
            texts += [f.read_text(encoding="utf-8") for f in files]
    return texts


def token_windows(model: Any, texts: Sequence[str], context_size: int = 128, max_windows: int | None = None) -> Tensor:
    """The texts as token windows `[n, context_size]` (BOS first), cut as the activation store cuts them.

    Example:
        >>> token_windows(model, ["Some text ..."], context_size=16).shape
        torch.Size([..., 16])
    """
    from ...store.text import TokenWindows

    rows = []
    for w in TokenWindows(model.tokenizer, list(texts), context_size, prepend_bos=True):
        rows.append(w)
        if max_windows is not None and len(rows) >= max_windows:
            break
    if not rows:
        raise ValueError(f"texts: too short for one window of context_size={context_size} tokens")
    return torch.stack(rows)


def activation_batches(
    model: Any,
    hook: str | list[str],
    texts: Sequence[str],
    batch_size: int = 4096,
    context_size: int = 128,
    seed: int = 0,
    device: str | torch.device = "cpu",
    keep_in_memory: bool = True,
) -> Iterator[Any]:
    """Endless mixed batches `[batch_size, d_in]` of `hook`'s activations on `texts`, from the activation
    store (a list of hooks: dicts hook -> `[batch_size, d]`, the same rows of every hook). The first pass
    over the data comes from the store; with `keep_in_memory` its rows are kept (as float16 when the
    activations are float32) and later passes reshuffle them instead of running the model again (a
    fresh, reseeded store per pass otherwise).

    Example:
        >>> x = next(activation_batches(model, "blocks.1.hook_resid_pre", texts))   # [4096, 128]
    """
    from ...store import ActivationStore

    kept: list[dict[str, Tensor]] = []
    epoch = 0
    single = isinstance(hook, str)

    def served(rows: dict[str, Tensor]) -> Any:
        return next(iter(rows.values())) if single else rows

    while True:
        if epoch and keep_in_memory:
            rows = {h: torch.cat([k[h] for k in kept]) if len(kept) > 1 else kept[0][h] for h in kept[0]}
            kept = [rows]
            n = next(iter(rows.values())).shape[0]
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            for i in range(0, n - batch_size + 1, batch_size):
                idx = order[i : i + batch_size]
                yield served({h: r[idx].to(device=device, dtype=torch.float32) for h, r in rows.items()})
        else:
            store = ActivationStore(
                model,
                hook,
                list(texts),
                context_size=context_size,
                batch_size=32,
                out_batch_size=batch_size,
                seed=seed + epoch,
                device=device,
            )
            for x in store:
                batch: dict[str, Tensor] = {str(hook): x} if isinstance(x, Tensor) else x
                assert isinstance(hook, str) or isinstance(x, dict)
                if next(iter(batch.values())).shape[0] == batch_size:
                    if keep_in_memory and not epoch:
                        kept.append(
                            {
                                h: t.to("cpu", torch.float16 if t.dtype == torch.float32 else t.dtype)
                                for h, t in batch.items()
                            }
                        )
                    yield x
            if not kept and keep_in_memory:
                raise ValueError(f"texts: fewer than batch_size={batch_size} tokens of activations")
        epoch += 1
