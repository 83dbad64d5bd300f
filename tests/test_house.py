"""The house's promises: model.py reads in one sitting, no module over 600 lines, no import circles."""

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


def test_model_py_reads_in_one_sitting() -> None:
    n = len((PACKAGE / "model.py").read_text(encoding="utf-8").splitlines())
    assert n <= MODEL_MAX_LINES, f"model.py is {n} lines (at most {MODEL_MAX_LINES}): move a job to a module of its own"


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


def test_model_imports_nothing_above_it() -> None:
    """model.py may use the modules below it, never loading or anything built on the model.
    (hooks.py makes the ActivationCache that run_with_cache returns: cache.py sits below model.)"""
    graph, seen, todo = _graph(), set(), ["interp_gpt.model"]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    above = {"interp_gpt.loading", "interp_gpt.compare", "interp_gpt.cli", "interp_gpt.patching", "interp_gpt.plots"}
    assert not seen & above, f"model.py reaches {sorted(seen & above)}"


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
    """The network and its hook machinery (hooks.py, splicing.py: splicing SAEs and transcoders) stand
    below every feature package: nothing they import at run time, directly or not, is one of them."""
    graph = _graph()
    for root in ("interp_gpt.model", "interp_gpt.hooks", "interp_gpt.splicing"):
        seen, todo = set(), [root]
        while todo:
            for m in graph[todo.pop()] - seen:
                seen.add(m)
                todo.append(m)
        features = sorted(m for m in seen if m.split(".")[1] in FEATURE_PACKAGES)
        assert not features, f"{root} reaches {features}"
