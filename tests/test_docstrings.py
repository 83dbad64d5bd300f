"""Every public name has a docstring, and the examples in those docstrings run on tiny-gpt2.

The public names are those the API reference documents (scripts/docs_hooks.py): the `__all__` of
`interp_gpt` and of every subpackage that has one, and the modules users import by name (MODULES;
`interp_gpt.utils` has no `__all__`: its public functions and classes, and `Slice`). For a class,
its public methods and properties count too, those defined in interp_gpt (in the class or a base
class of ours, such as GPT's mixins); an override of a method a base outside the package documents
(`nn.Module.forward`, `extra_repr`) still needs its own line. A type alias (`metrics.Metric`) cannot
carry a docstring and is left out, as the API page shows its definition instead.

How the examples run (the rule). Each docstring's `>>>` lines are one doctest (ELLIPSIS and
NORMALIZE_WHITESPACE), run in a temporary working directory (with `data/` of the clone in it), in
the globals of the module that defines the object plus the names of the package that exports it,
seeded with the fixtures an example may use without building them (repeating that setup in every
docstring would drown the point of each example); whatever an example needs beyond these, it builds:

    model, sae, tcs   tiny-gpt2, its shipped SAE and per-layer transcoders (fresh copies per docstring)
    tokens, logits, cache                      PROMPT and model.run_with_cache on it
    clean_tokens / clean, corrupted_tokens / corrupted, clean_logits, corrupted_logits, clean_cache,
    corrupted_cache, answers, metric           CLEAN vs CORRUPTED, normalized_logit_diff on ANSWERS
    g      circuits.Graph of the model         graph  attribution.attribute(model, PROMPT, tcs)
    store  an ActivationStore on data/corpus   torch, every name of `interp_gpt.__all__`, and the
    subpackages circuits, evals, patching, plots, sae, utils

An example that shows an output is compared with it (so printed shapes and values cannot drift);
one that shows none only has to run. An example that cannot run offline on tiny-gpt2 (GPT-2's
weights, a reference library that is not a core dependency, the network) says so in its text with
the marker `needs GPT-2` / `needs the network` / `needs transformer-lens`, and is skipped;
NEEDS_MORE lists those, so the list stays short and on purpose (today: the two comparisons
against transformer-lens, which tests/test_compare.py runs where the `compare` extra is installed).
"""

from __future__ import annotations

import ast
import copy
import doctest
import importlib
import inspect
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from public_api import MODULES, public_modules  # noqa: E402  (the API reference's list: one list for both)

PROMPT = "The cat sat on the mat because it was tired."
# A clean / corrupted pair of one length, and the answers (clean's, corrupted's) as single tokens.
CLEAN = "The man gave the book to the woman, and then she gave it to"
CORRUPTED = "The woman gave the book to the man, and then he gave it to"
ANSWERS = (" him", " her")
# Docstrings whose examples need more than tiny-gpt2 and the core install (each says which, by MARKER).
NEEDS_MORE = {"interp_gpt.compare", "interp_gpt.compare_with_transformer_lens"}
MARKER = re.compile(r"needs (GPT-2|the network|transformer-lens)")


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("interp_gpt")


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """(name, function) for the public methods and properties `cls` has from interp_gpt's classes."""
    seen = set()
    for base in cls.__mro__:
        if not _ours(base):
            continue
        for name, value in vars(base).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value) or isinstance(value, property):
                yield name, value


def public_objects() -> dict[str, Any]:
    """Qualified name -> object for every public function, class, method and property, each once
    (under the first name it is exported by)."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for module, names in public_modules().items():
        imported = importlib.import_module(module)
        for name in names:
            obj = getattr(imported, name)
            if typing.get_origin(obj) is not None or not (inspect.isclass(obj) or callable(obj)):
                continue  # a type alias or a constant: no docstring of its own
            items = [(f"{module}.{name}", obj)]
            if inspect.isclass(obj):
                items += [(f"{module}.{name}.{m}", f) for m, f in _members(obj)]
            for qualified, o in items:
                if id(o) not in seen:
                    seen.add(id(o))
                    out[qualified] = o
    return out


def own_doc(obj: Any) -> str:
    """The object's own docstring (a class's is not inherited from its base; a property's is its
    getter's, or the one it was made with)."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return doc or ""


OBJECTS = public_objects()
MODULE_NAMES = public_modules()


def test_the_walk_sees_the_whole_api() -> None:
    # the list of modules is the API reference's: docs_hooks.py takes it from scripts/public_api.py too
    tree = ast.parse((REPO / "scripts" / "docs_hooks.py").read_text())
    assert any(
        isinstance(node, ast.ImportFrom)
        and node.module == "public_api"
        and any(a.name == "public_modules" for a in node.names)
        for node in tree.body
    )
    assert MODULES and all(m in public_modules() for m in MODULES)
    modules = public_modules()
    assert {"interp_gpt", "interp_gpt.patching", "interp_gpt.circuits", "interp_gpt.sae", "interp_gpt.store"} <= set(
        modules
    )
    assert "interp_gpt.GPT.run_with_cache" in OBJECTS  # a method from a base class of ours
    assert "interp_gpt.GPT.to_tokens" in OBJECTS  # ... and from a mixin
    assert len(OBJECTS) > 300, len(OBJECTS)


def test_every_public_name_has_a_docstring() -> None:
    missing = [name for name, obj in OBJECTS.items() if not own_doc(obj).strip()]
    assert not missing, f"{len(missing)} public names have no docstring:\n" + "\n".join(missing)


# ----- the examples --------------------------------------------------------------------------
def examples() -> dict[str, Any]:
    """Qualified name -> object, for the docstrings with `>>>` lines."""
    return {name: obj for name, obj in OBJECTS.items() if ">>>" in own_doc(obj)}


EXAMPLES = examples()


@pytest.fixture(scope="module")
def seeds() -> dict[str, Any]:
    import interp_gpt
    from interp_gpt import circuits, evals, patching, plots, sae, store, utils
    from interp_gpt.attribution import attribute
    from interp_gpt.metrics import normalized_logit_diff
    from interp_gpt.sae.data import shipped_sae, shipped_transcoders

    torch.manual_seed(0)
    model = interp_gpt.GPT.from_pretrained("tiny-gpt2")
    tokens = model.to_tokens(PROMPT)
    logits, cache = model.run_with_cache(tokens)
    clean_tokens, corrupted_tokens = model.to_tokens(CLEAN), model.to_tokens(CORRUPTED)
    clean_logits, clean_cache = model.run_with_cache(clean_tokens)
    corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens)
    answers = torch.tensor([[model.to_single_token(a) for a in ANSWERS]])
    tcs = shipped_transcoders(model)
    return {
        **{name: getattr(interp_gpt, name) for name in interp_gpt.__all__},
        **{m.__name__.rsplit(".", 1)[1]: m for m in (circuits, evals, patching, plots, sae, utils)},
        "torch": torch,
        "model": model,
        "prompt": PROMPT,
        "tokens": tokens,
        "logits": logits,
        "cache": cache,
        "clean_tokens": clean_tokens,
        "corrupted_tokens": corrupted_tokens,
        "clean": clean_tokens,
        "corrupted": corrupted_tokens,
        "clean_logits": clean_logits,
        "corrupted_logits": corrupted_logits,
        "clean_cache": clean_cache,
        "corrupted_cache": corrupted_cache,
        "answers": answers,
        "metric": normalized_logit_diff(answers, clean_logits, corrupted_logits),
        "g": circuits.Graph.from_model(model),
        "sae": shipped_sae(),
        "tcs": tcs,
        "graph": attribute(model, PROMPT, tcs),
        "store": store.ActivationStore(
            model, "blocks.1.hook_resid_pre", str(REPO / "data" / "corpus"), context_size=64, out_batch_size=256
        ),
    }


FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class _RunsOrMatches(doctest.OutputChecker):
    """A line that shows no output only has to run; one that shows output must match it."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return not want.strip() or super().check_output(want, got, optionflags)


def _module_globals(obj: Any) -> dict[str, Any]:
    target = obj.fget if isinstance(obj, property) else obj
    return dict(vars(sys.modules[target.__module__]))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_docstring_example_runs(
    name: str, seeds: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = EXAMPLES[name]
    doc = own_doc(obj)
    if MARKER.search(doc):
        assert name in NEEDS_MORE, f"{name} says it needs more than tiny-gpt2: add it to NEEDS_MORE"
        pytest.skip(f"{name}: {MARKER.search(doc).group(0)}")  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(REPO / "data")  # examples read data/corpus, as from a clone
    fresh = {k: copy.deepcopy(seeds[k]) for k in ("model", "sae", "tcs")}  # an example may splice or fold them
    exporter = importlib.import_module(max((m for m in MODULE_NAMES if name.startswith(m + ".")), key=len))
    globs = {
        **_module_globals(obj),
        **{n: getattr(exporter, n) for n in MODULE_NAMES[exporter.__name__]},
        **seeds,
        **fresh,
    }
    test = doctest.DocTestParser().get_doctest(doc, globs, name, None, 0)
    runner = doctest.DocTestRunner(_RunsOrMatches(), optionflags=FLAGS, verbose=False)
    report: list[str] = []
    torch.manual_seed(0)
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_the_skipped_examples_are_the_listed_ones() -> None:
    marked = {name for name, obj in EXAMPLES.items() if MARKER.search(own_doc(obj))}
    assert marked == NEEDS_MORE
    assert len(NEEDS_MORE) <= 3
    assert len(EXAMPLES) - len(NEEDS_MORE) >= 100
