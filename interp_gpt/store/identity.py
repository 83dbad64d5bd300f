"""A harvest's identity: everything its shards depend on, recorded, compared, and refused by name.

A harvest records `identity(store)` (plus `n_tokens` and `shard_tokens`) in every progress file and in
its manifest. Before it resumes, appends a shard or hands back a finished harvest it compares the
recorded identity with the store's, and refuses any difference, naming the field
(`saes.blocks.0.hook_resid_pre: (none) there, {...} here`). The parts:

    hooks, context_size, prepend_bos, batch_size, shuffle, seed, dtype, world_size   the store's settings
    model        name, a sha256 of every weight (edited weights are another model), the config fields
                 the forward reads, the weights' dtype and device type (cpu and cuda round differently)
    saes         every spliced SAE by its hook: use_error_term, architecture, d_sae, a sha256 of its
                 weights and one of its config (model.add_sae)
    user_hooks   every hook point with forward hooks that fire in the harvest's passes (add_hook,
                 add_perma_hook, or the caller's `with model.hooks(...)`): each function's qualified
                 name and a sha256 of its code. A function's captured values cannot be hashed in
                 general: keep them the same across a resume (the code and name are checked)
    tokenizer    name, vocab size, BOS id and a sha256 of its full description
    data         the files (name and size), or the iterable's type; the text itself is compared
                 through its sha256 (see harvest.py), which depends on the text alone
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
from typing import Any

import torch

from .text import describe_data

__all__ = ["identity", "differences"]

_NOT_THE_FORWARD = ("device", "seed", "init_range", "model_name", "tokenizer_name")  # model.cfg fields
_ABSENT = object()


def _tensors_sha256(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(name.encode())
        h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value).removeprefix("torch.")


def _model(model: Any) -> dict[str, Any]:
    cfg = model.cfg
    fields = dataclasses.fields(cfg) if dataclasses.is_dataclass(cfg) else ()
    p = next(iter(model.parameters()), None)
    return {
        "name": cfg.model_name,
        "weights_sha256": _tensors_sha256(model.state_dict()),
        "config": {f.name: _plain(getattr(cfg, f.name)) for f in fields if f.name not in _NOT_THE_FORWARD},
        "device": p.device.type if p is not None else "cpu",
    }


def _saes(model: Any) -> dict[str, Any]:
    """Each spliced SAE (it changes every activation downstream of its hook) by its hook name."""
    out = {}
    for name, sae in sorted(getattr(model, "acts_to_saes", {}).items()):
        cfg = {k: v for k, v in sae.cfg.to_dict().items() if k != "device"}
        out[name] = {
            "use_error_term": bool(getattr(model.hook_dict[name], "use_error_term", False)),
            "architecture": cfg.get("architecture"),
            "d_sae": cfg.get("d_sae"),
            "weights_sha256": _tensors_sha256(sae.state_dict()),
            "config_sha256": hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest(),
        }
    return out


def _code_sha256(code: types.CodeType) -> str:
    h = hashlib.sha256(code.co_code)
    for const in code.co_consts:  # nested functions' code by content, not by address
        h.update(_code_sha256(const).encode() if isinstance(const, types.CodeType) else repr(const).encode())
    h.update(repr(code.co_names).encode())
    return h.hexdigest()


def _function(fn: Any) -> str:
    """`module.qualname` and a sha256 of the code of a hook function (or of a callable object's __call__)."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', type(inner).__qualname__)}"
    call = getattr(type(inner), "__call__", None)  # noqa: B004  # a callable object's method, not a test
    code = getattr(inner, "__code__", None) or getattr(call, "__code__", None)
    return f"{name} (code sha256 {_code_sha256(code)[:16]})" if code is not None else name


def _user_hooks(model: Any) -> dict[str, list[str]]:
    """The forward hooks that would fire in this thread's passes, by hook point (backward hooks do not
    change an activation)."""
    points = list(getattr(model, "_all_hook_points", None) or ())
    seen = {id(hp) for hp in points}
    points += [hp for hp in getattr(model, "hook_dict", {}).values() if id(hp) not in seen]
    out = {}
    for hp in points:
        mine = hp._mine(hp.fwd_hooks) if hasattr(hp, "_mine") else list(getattr(hp, "fwd_hooks", []))
        if mine:
            out[hp.name] = [_function(h.fn) for h in mine]
    return dict(sorted(out.items()))


def identity(store: Any) -> dict[str, Any]:
    """What the shards depend on, besides the text and the sizes: compared on resume and in a folder."""
    model, tok = store.model, store.model.tokenizer
    backend = getattr(tok, "backend", None)
    tok_text = backend.to_str() if backend is not None else repr(tok)
    return {
        "hooks": store.hooks,
        "context_size": store.context_size,
        "prepend_bos": store.prepend_bos,
        "batch_size": store.batch_size,
        "shuffle": store.shuffle,
        "seed": store.seed,
        "dtype": str(store.dtype).removeprefix("torch."),
        "world_size": store.world_size,
        "model": _model(model),
        "saes": _saes(model),
        "user_hooks": _user_hooks(model),
        "tokenizer": {
            "name": getattr(tok, "name", None),
            "vocab_size": int(tok.vocab_size),
            "bos_token_id": int(tok.bos_token_id),
            "sha256": hashlib.sha256(tok_text.encode()).hexdigest(),
        },
        "data": describe_data(store.data),
    }


def differences(
    old: dict[str, Any], new: dict[str, Any], prefix: str = "", there: str = "there", here: str = "here"
) -> list[str]:
    """`field: old there, new here` for every field that differs (nested fields dotted; `(none)` for a
    field one side lacks)."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.", there, here)
        elif a != b:
            show = ["(none)" if v is _ABSENT else repr(v) for v in (a, b)]
            out.append(f"{prefix}{key}: {show[0]} {there}, {show[1]} {here}")
    return out
