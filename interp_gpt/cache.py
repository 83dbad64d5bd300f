"""ActivationCache: the activations a `run_with_cache` call stored, by hook name."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from .utils import get_act_name


class ActivationCache(Mapping[str, Tensor]):
    """A read-only mapping from hook name to cached activation.

    Indexing takes full names or transformer-lens' short forms, with negative
    layers counting from the end:

    Example:
        >>> logits, cache = model.run_with_cache("Hello world")
        >>> cache["blocks.0.attn.hook_pattern"] is cache["pattern", 0]
        True
        >>> cache["scale", 2, "ln1"]; cache["resid_post", -1]
    """

    def __init__(self, cache_dict: dict[str, Tensor], model: Any, has_batch_dim: bool = True) -> None:
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim

    def _key(self, key: str | tuple) -> str:
        if isinstance(key, str):  # a full name, else a short one ("embed", "pre1", "scale")
            return key if key in self.cache_dict else get_act_name(key)
        if isinstance(key, tuple) and key and isinstance(key[0], str):
            name, *rest = key
            layer = rest[0] if rest else None
            if layer is not None:
                n_layers = self.model.cfg.n_layers
                if not isinstance(layer, int) or not -n_layers <= layer < n_layers:
                    raise KeyError(
                        f"cache[{key!r}]: layer {layer!r} is out of range, layers are 0..{n_layers - 1}"
                    )
                layer %= n_layers
            return get_act_name(name, layer, rest[1] if len(rest) > 1 else None)
        raise KeyError(f"cache key must be a hook name or a (name, layer[, layer_type]) tuple, got {key!r}")

    def __getitem__(self, key: str | tuple) -> Tensor:
        name = self._key(key)
        if name not in self.cache_dict:
            stored = list(self.cache_dict)
            shown = ", ".join(stored[:12]) + (f", ... ({len(stored)} in all)" if len(stored) > 12 else "")
            raise KeyError(f"the cache holds no {name!r} (asked as {key!r}); it holds: {shown}")
        return self.cache_dict[name]

    def __contains__(self, key: object) -> bool:
        try:
            return self._key(key) in self.cache_dict  # type: ignore[arg-type]
        except KeyError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"

    def to(self, device: torch.device | str) -> ActivationCache:
        """Move every cached tensor to `device` (in place) and return self."""
        self.cache_dict = {k: v.to(device) for k, v in self.cache_dict.items()}
        return self

    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch axis of a batch-1 cache (in place) and return self."""
        if not self.has_batch_dim:
            return self
        for name, t in self.cache_dict.items():
            if t.shape[0] != 1:
                raise ValueError(
                    f"remove_batch_dim: {name} has batch size {t.shape[0]}; only a batch of 1 can drop it"
                )
        self.cache_dict = {k: v[0] for k, v in self.cache_dict.items()}
        self.has_batch_dim = False
        return self
