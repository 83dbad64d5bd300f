"""The public names of interp_gpt, module by module: what the documentation site's API reference lists
(scripts/docs_hooks.py) and what tests/test_docstrings.py holds to a docstring each. One list, so the two
cannot drift. Imports nothing but the package (no mkdocs), so the test suite can use it without the docs extra."""

from __future__ import annotations

import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Modules (not packages) that users import by name, as in transformer-lens: a page each too.
MODULES = (
    "interp_gpt.utils",
    "interp_gpt.evals",
    "interp_gpt.head_detector",
    "interp_gpt.metrics",
    "interp_gpt.inspect",
    "interp_gpt.steering",
)
# Folders that lay out the house (the network and GPT's methods, checkpoints, tokenizers, the command line, the
# SAE family's three parts): what users import from them is documented where they meet it (`interp_gpt.GPT`,
# `interp_gpt.sae`, `interp_gpt.loading`, ...), not a second time per folder.
LAYOUT = (
    "interp_gpt.model",
    "interp_gpt.checkpoints",
    "interp_gpt.tokenizer",
    "interp_gpt.cli",
    "interp_gpt.sae.saes",
    "interp_gpt.sae.saes.architectures",
    "interp_gpt.sae.transcoders",
    "interp_gpt.sae.training",
)
# ... and what such a module offers without defining it (transformer-lens has `utils.Slice`).
REEXPORTED = {"interp_gpt.utils": ["Slice"]}


def public_modules() -> dict[str, list[str]]:
    """`interp_gpt`, each subpackage with an `__all__`, and MODULES -> the names they export
    (a module without `__all__`: the public functions and classes it defines)."""
    found = {}
    packages = [
        ".".join(p.parent.relative_to(REPO).parts) for p in sorted((REPO / "interp_gpt").glob("**/__init__.py"))
    ]
    for module in [*(p for p in packages if p not in LAYOUT), *MODULES]:
        imported = importlib.import_module(module)
        names = getattr(imported, "__all__", None)
        if names is None and module in MODULES:
            names = [
                n
                for n, obj in vars(imported).items()
                if not n.startswith("_") and callable(obj) and getattr(obj, "__module__", None) == module
            ] + REEXPORTED.get(module, [])
        if names is not None:
            found[module] = list(names)
    return found
