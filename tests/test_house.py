"""The house's promises: the folders show the architecture (the network in model/, checkpoints below it,
each analysis a package of its own), the network reads in one sitting (model/gpt.py), no module over 600
lines, no import circles, no module reaching into another's private names, every module saying its
public names (`__all__`)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "interp_gpt"
MODEL_MAX_LINES, MODULE_MAX_LINES = 450, 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(source: str, package: str) -> set[str]:
    """The interp_gpt modules a module of `package` imports when it runs (lazy imports inside
    functions count; imports under `if TYPE_CHECKING:` do not: they are for the type checker alone)."""
    tree = ast.parse(source)
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            if target.startswith("interp_gpt"):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)  # `from . import plots`
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("interp_gpt"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, p in files.items():
        package = name if p.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in _runtime_imports(p.read_text(encoding="utf-8"), package) if m in files and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_network_reads_in_one_sitting() -> None:
    n = len((PACKAGE / "model" / "gpt.py").read_text(encoding="utf-8").splitlines())
    assert n <= MODEL_MAX_LINES, f"model/gpt.py is {n} lines (at most {MODEL_MAX_LINES}): move a job beside it"


# The folders a newcomer reads the architecture from (DESIGN.md, "The house").
PACKAGES = (
    "model", "checkpoints", "tokenizer", "cli", "store", "sae", "sae/saes", "sae/transcoders", "sae/training",
    "sae/synthetic", "patching", "circuits", "attribution", "lenses", "causal", "plots",
)  # fmt: skip
TOP_LEVEL_MAX = 20


def test_the_folders_show_the_architecture() -> None:
    missing = [d for d in PACKAGES if not (PACKAGE / d / "__init__.py").is_file()]
    assert not missing, f"packages of the house missing: {missing}"
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= TOP_LEVEL_MAX, f"{len(top)} top-level modules (at most {TOP_LEVEL_MAX}): {top}"


def _declares_all(source: str) -> bool:
    for node in ast.parse(source).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "__all__" for a in node.names):
            return True
    return False


def test_every_module_says_its_public_names() -> None:
    """`__all__` in every module: the public API is what a module says, not whatever it happens to import."""
    silent = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if not _declares_all(p.read_text()))
    assert not silent, f"modules without __all__: {silent}"
    assert not _declares_all("from .x import y\ndef f(): pass\n")
    assert _declares_all("__all__: list[str] = []\n") and _declares_all("from .x import __all__ as __all__\n")


def test_no_module_is_over_600_lines() -> None:
    big = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_MAX_LINES
    }
    assert not big, f"modules over {MODULE_MAX_LINES} lines: {big}"


def test_the_package_has_no_import_circle() -> None:
    # __init__ modules re-export their package's modules: only circles between modules count.
    graph = {k: {m for m in v if not k.startswith(m + ".")} for k, v in _graph().items()}
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph) or [])}"


def _reached(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def _package(graph: dict[str, set[str]], name: str) -> list[str]:
    return [m for m in graph if m == f"interp_gpt.{name}" or m.startswith(f"interp_gpt.{name}.")]


def test_the_model_imports_nothing_above_it() -> None:
    """model/ may use the modules below it, never loading or anything built on the model.
    (hooks.py makes the ActivationCache that run_with_cache returns: cache.py sits below model.)"""
    graph = _graph()
    seen = _reached(graph, _package(graph, "model"))
    above = {"interp_gpt.loading", "interp_gpt.compare", "interp_gpt.cli", "interp_gpt.patching", "interp_gpt.plots"}
    reached = sorted(m for m in seen if any(m == a or m.startswith(a + ".") for a in above))
    assert not reached, f"model/ reaches {reached}"


def test_checkpoints_import_nothing_from_the_model() -> None:
    """sources -> convert -> processing read and convert weights; the model's loading methods call down into
    them, never the other way (imports under TYPE_CHECKING, for annotations, do not count)."""
    graph = _graph()
    seen = _reached(graph, _package(graph, "checkpoints"))
    reached = sorted(m for m in seen if m.startswith("interp_gpt.model"))
    assert not reached, f"checkpoints/ reaches {reached}"


# The layers of the house, lowest first (README, "Layout"): a module imports only from its own layer or
# the ones below it. `cli/common.py` (the help format and the --data rule every command module shares)
# imports nothing but checks: it sits with the base, so each package can keep its own command module.
LAYERS = (
    ("config", "checks", "files", "slices", "factored", "utils", "hooks", "cache", "metrics", "cli.common"),
    ("tokenizer", "checkpoints"),
    ("model",),
    ("loading", "prepare", "inspect", "planted", "evals", "head_detector", "compare"),
    ("patching", "circuits", "plots", "sae", "store"),
    ("attribution", "lenses", "causal", "steering"),
    ("cli", "activation_store"),
)


def _layer(module: str) -> int:
    parts = module.split(".")[1:]
    for i, names in enumerate(LAYERS):
        if ".".join(parts[:2]) in names:
            return i
    for i, names in enumerate(LAYERS):
        if parts[0] in names:
            return i
    raise AssertionError(f"{module} is in no layer of the house: add its folder to LAYERS (and the README's picture)")


def test_every_module_imports_only_from_its_layer_or_below() -> None:
    graph = _graph()
    upward = sorted(
        f"{a} -> {b}"
        for a, deps in graph.items()
        if a != "interp_gpt"
        for b in deps
        if b != "interp_gpt" and _layer(b) > _layer(a)  # `from .. import __version__` reads the package root
    )
    assert not upward, f"imports from a higher layer: {upward}"
    assert _layer("interp_gpt.cli.common") == 0 and _layer("interp_gpt.cli.commands") == len(LAYERS) - 1
    assert _layer("interp_gpt.sae.saes.core") == 4 and _layer("interp_gpt.model.gpt") == 2


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .model import GPT\nfrom .config import Config\n"
    )
    assert _runtime_imports(source, "interp_gpt") == {"interp_gpt.config", "interp_gpt.config.Config"}
    lazy = "def f():\n    from ..model import GPT\n"
    assert _runtime_imports(lazy, "interp_gpt.plots") == {"interp_gpt.model", "interp_gpt.model.GPT"}


FEATURE_PACKAGES = (
    "sae", "store", "circuits", "patching", "plots", "attribution", "lenses", "causal", "steering",
    "activation_store", "cli", "compare", "loading",
)  # fmt: skip


def test_the_model_and_the_hooks_layer_import_no_feature_package() -> None:
    """The network and its hook machinery (hooks.py, model/splicing.py: splicing SAEs and transcoders) stand
    below every feature package: nothing they import at run time, directly or not, is one of them."""
    graph = _graph()
    for root in ("model", "hooks"):
        features = sorted(m for m in _reached(graph, _package(graph, root)) if m.split(".")[1] in FEATURE_PACKAGES)
        assert not features, f"interp_gpt.{root} reaches {features}"


# ----------------------------------------------------------------------------
# one way in: no module reaches into another module's private names
# ----------------------------------------------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_imports(source: str, module: str, package: str, modules: set[str]) -> set[tuple[str, str]]:
    """(target, name) for each import of `module` (lazy and type-checking ones too) that reaches into
    another module's privates: an underscore name of another module (`from .patch import _base_of`), or a
    private module of another package (`from ..circuits._run import BaseRun`: name "*"). A package's own
    private modules are its own and its subpackages' (`from ._inputs import prepare` inside circuits,
    `from .._inputs import prepare` inside circuits.mib)."""

    def own(owner: str) -> bool:
        return package == owner or package.startswith(owner + ".")

    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = package
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
        if not target.startswith("interp_gpt"):
            continue
        parts = target.split(".")
        if any(_private(p) for p in parts) and not own(target.rpartition(".")[0]):
            found.add((target, "*"))
        for alias in node.names:
            if not _private(alias.name):
                continue
            if f"{target}.{alias.name}" in modules:  # a private module: its package's own
                if not own(target):
                    found.add((f"{target}.{alias.name}", "*"))
            elif target != module:
                found.add((target, alias.name))
    return found


def _all_private_imports() -> set[tuple[str, str, str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    out = set()
    for name, p in files.items():
        package = name if p.name == "__init__.py" else name.rpartition(".")[0]
        for target, imported in _private_imports(p.read_text(encoding="utf-8"), name, package, set(files)):
            out.add((name, target, imported))
    return out


def test_no_module_imports_another_modules_private_names() -> None:
    """One way in: a name another module needs is public where it lives (and said in its `__all__`); a
    package's own private modules are its own (`circuits._run` inside circuits)."""
    found = sorted(_all_private_imports())
    assert not found, f"imports of another module's private names (make them public where they live): {found}"


def test_the_private_import_finder_finds_them() -> None:
    modules = {"interp_gpt.circuits.patch", "interp_gpt.circuits._run", "interp_gpt.circuits._inputs"}
    find = lambda src, mod="interp_gpt.circuits.scores": _private_imports(src, mod, "interp_gpt.circuits", modules)  # noqa: E731
    assert find("from .patch import Metric, _base_of\n") == {("interp_gpt.circuits.patch", "_base_of")}
    assert find("def f():\n    from .patch import _x as y\n") == {("interp_gpt.circuits.patch", "_x")}
    assert find("from ._run import BaseRun\nfrom . import _inputs\nfrom .patch import __all__\n") == set()
    assert find("from ._run import _helper\n") == {("interp_gpt.circuits._run", "_helper")}
    other = _private_imports(
        "from ..circuits._run import BaseRun\n", "interp_gpt.attribution.qk", "interp_gpt.attribution", modules
    )
    assert other == {("interp_gpt.circuits._run", "*")}
    sub = _private_imports(
        "from .._run import BaseRun\nfrom .. import _inputs\n",
        "interp_gpt.circuits.mib.score",
        "interp_gpt.circuits.mib",
        modules,
    )
    assert sub == set()  # a subpackage of circuits may use circuits' private modules
