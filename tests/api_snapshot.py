"""Record or list interp_gpt's public API: every public name of every module, with its signature.

    python tests/api_snapshot.py > tests/data/public_api.json   # record (only when the API changes on purpose)

`tests/test_public_api.py` checks that every recorded name still imports from the same module
with the same parameters (names, kinds and defaults; annotations may be reworded).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

MODULES = [
    "interp_gpt",
    "interp_gpt.cache",
    "interp_gpt.causal",
    "interp_gpt.cli",
    "interp_gpt.compare",
    "interp_gpt.config",
    "interp_gpt.hooks",
    "interp_gpt.inspect",
    "interp_gpt.lenses",
    "interp_gpt.loading",
    "interp_gpt.metrics",
    "interp_gpt.model",
    "interp_gpt.patching",
    "interp_gpt.plots",
    "interp_gpt.steering",
    "interp_gpt.tokenizer",
    "interp_gpt.utils",
    # the house's folders (2026-11-28) and the old paths kept working beside them
    "interp_gpt.activation_store",
    "interp_gpt.attribution",
    "interp_gpt.checkpoints",
    "interp_gpt.circuits",
    "interp_gpt.circuits.mib",
    "interp_gpt.sae",
    "interp_gpt.sae.data",
    "interp_gpt.sae.features",
    "interp_gpt.sae.saes",
    "interp_gpt.sae.training",
    "interp_gpt.sae.transcoders",
    "interp_gpt.store",
]


def signature_of(obj: Any) -> list[list[str]] | None:
    """[name, kind, default] per parameter, or None for what has no signature."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        default = "" if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, p.kind.name, default])
    return out


def _public(names: Any) -> list[str]:
    return sorted(n for n in names if not n.startswith("_"))


def describe_class(cls: type) -> dict[str, Any]:
    members: dict[str, Any] = {}
    ours = {n for k in cls.__mro__ if k.__module__.startswith("interp_gpt") for n in vars(k)}
    for name in _public(ours):  # what our classes define, not what torch or object add
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, property):
            members[name] = "property"
        elif isinstance(attr, (classmethod, staticmethod)) or callable(attr):
            members[name] = signature_of(getattr(cls, name))
        else:
            members[name] = "attribute"
    return members


def snapshot() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        names = list(mod.__all__) if hasattr(mod, "__all__") else _public(vars(mod))
        entry: dict[str, Any] = {}
        for name in names:
            if not hasattr(mod, name):
                continue  # listed in __all__ but gone: the test reports it missing
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or name == "TYPE_CHECKING":
                continue
            if not hasattr(mod, "__all__") and not getattr(obj, "__module__", mod_name).startswith("interp_gpt"):
                continue  # imported from elsewhere (torch, typing ...)
            if inspect.isclass(obj):
                entry[name] = {"class": describe_class(obj)}
            elif callable(obj):
                entry[name] = {"function": signature_of(obj)}
            else:
                entry[name] = {"value": type(obj).__name__}
        out[mod_name] = entry
    return out


if __name__ == "__main__":
    json.dump(snapshot(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
