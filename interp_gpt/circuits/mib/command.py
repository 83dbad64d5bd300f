"""`interp-gpt mib-score` and `interp-gpt mib-check`: score a method as MIB does and write its submission
folder; check a folder before uploading it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "METHODS",
    "SCORE_HELP",
    "SCORE_DESCRIPTION",
    "SCORE_EXAMPLES",
    "CHECK_HELP",
    "CHECK_DESCRIPTION",
    "CHECK_EXAMPLES",
    "add_score_arguments",
    "add_check_arguments",
    "run_score",
    "run_check",
    "SUBCOMMANDS",
]

# --method -> the scorer's name in interp_gpt.circuits (looked up when run)
METHODS = {
    "eap": "eap_scores",
    "eap-ig": "eap_ig_scores",
    "gim": "gim_scores",
    "relp": "relp_scores",
    "atp-star": "atp_star_scores",
}
TEMPLATES = ("induction", "name-mover")

SCORE_HELP = "score edges with a method and report MIB's CPR / CMD beside random circuits; write the submission folder"
SCORE_DESCRIPTION = (
    "Score every edge of MODEL's graph on a task with --method, then evaluate the scores as MIB's circuit track "
    "does (faithfulness at 0.1 ... 100 percent of the edges, CPR and CMD, --intervention) beside --random random "
    "circuits, and write OUT/NAME/importances.json (MIB's graph file) and OUT/NAME/mib_score.json. --task is "
    "induction or name-mover (built offline from templates) or a local file in MIB's column layout."
)
SCORE_EXAMPLES = [
    "tiny-gpt2 --task induction --method eap-ig --out mib/eap-ig",
    "tiny-gpt2 --task data/ioi.jsonl --method eap --intervention mean-positional --out mib/eap --name ioi_gpt2",
]
CHECK_HELP = "check a MIB submission folder (what is missing, before anyone uploads it)"
CHECK_DESCRIPTION = (
    "Check FOLDER as MIB's leaderboard reads it: '{task}_{model}' folders, one importance file or nine circuits "
    "each, files that read as MIB graphs (of MODEL's shape for the _gpt2 folders), at least two tasks and two "
    "models. Prints each problem; exits 1 if there is any."
)
CHECK_EXAMPLES = ["mib/eap-ig", "mib/eap-ig --model gpt2"]


def add_score_arguments(p: argparse.ArgumentParser) -> None:
    """The `mib-score` options."""
    from .score import MIB_INTERVENTIONS

    p.add_argument("model", metavar="MODEL", nargs="?", default="tiny-gpt2", help="tiny-gpt2 (default), gpt2, a folder")
    p.add_argument("--task", required=True, help="induction, name-mover, or a .csv / .json / .jsonl task file")
    p.add_argument("--n", type=int, default=24, metavar="N", help="prompt pairs (default 24; a file: its first N)")
    p.add_argument("--method", choices=sorted(METHODS), default="eap-ig", help="edge scorer (default eap-ig)")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG's interpolation steps (default 5)")
    p.add_argument("--intervention", choices=MIB_INTERVENTIONS, default="patching", help="default patching")
    p.add_argument("--level", choices=("edge", "node"), default="edge", help="default edge")
    p.add_argument("--random", type=int, default=10, metavar="K", help="random circuits for the baseline (0: none)")
    p.add_argument("--out", required=True, metavar="FOLDER", help="the submission folder (OUT/NAME/importances.json)")
    p.add_argument("--name", help="the folder for this task and model, e.g. ioi_gpt2 (default: TASK_MODEL)")
    p.add_argument("--format", choices=("json", "pt"), default="json", help="graph file format (default json)")


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    """The `mib-check` options."""
    p.add_argument("folder", metavar="FOLDER", help="the submission folder")
    p.add_argument("--model", default=None, help="read the _gpt2 folders' files against this model (e.g. gpt2)")


def _task(model: Any, spec: str, n: int) -> Any:
    from .tasks import induction_task, name_mover_task, read_task

    if spec == "induction":
        return induction_task(model, n=n)
    if spec == "name-mover":
        return name_mover_task(model, n=n)
    path = Path(spec)
    if not path.suffix:
        raise ValueError(f"--task {spec!r}: expected {' or '.join(TEMPLATES)}, or a .csv / .json / .jsonl file")
    return read_task(path, model, n=n)


def run_score(args: argparse.Namespace, load_model: Callable[[str], Any]) -> int:
    """`interp-gpt mib-score MODEL --task T --method M --out FOLDER`; returns 0."""
    import interp_gpt.circuits as circuits

    from ..graph import Graph
    from .format import save_mib_graph
    from .score import mib_random_baseline, mib_score

    model = load_model(args.model)
    task = _task(model, args.task, args.n)
    fn = getattr(circuits, METHODS[args.method])
    kw = {"steps": args.steps} if args.method == "eap-ig" else {}
    scores = fn(model, task.clean, task.corrupted, task.metric, **kw)
    name = args.name or f"{task.name}_{Path(str(args.model)).name}"
    folder = Path(args.out) / name
    graph = Graph(model.cfg)
    path = save_mib_graph(folder / f"importances.{args.format}", model, scores, node_scores=graph.node_scores(scores))
    result = mib_score(model, task, scores, level=args.level, intervention=args.intervention, progress=False)
    report: dict[str, Any] = {
        "model": args.model, "task": task.name, "prompts": len(task), "method": args.method,
        "intervention": args.intervention, "level": args.level, "cpr": result.cpr, "cmd": result.cmd,
        "percentages": list(result.percentages), "faithfulness": result.faithfulness.tolist(),
        "n_edges": result.n_edges, "full": result.full, "empty": result.empty,
    }  # fmt: skip
    print(f"{args.method} on {task!r}, {args.intervention}, {args.level} level: CPR {result.cpr:.4f} (higher is "
          f"better), CMD {result.cmd:.4f} (lower is better)")  # fmt: skip
    for pct, k, f in zip(result.percentages, result.n_edges, result.faithfulness.tolist(), strict=True):
        print(f"  {pct:>6.1%} of the {args.level}s: {k:6d} edges, faithfulness {f:+.4f}")
    if args.random:
        base = mib_random_baseline(
            model, task, n_samples=args.random, level=args.level, intervention=args.intervention, progress=False
        )
        report["random"] = {"cpr_mean": base.cpr_mean, "cpr_std": base.cpr_std, "cmd_mean": base.cmd_mean,
                            "cmd_std": base.cmd_std, "samples": args.random}  # fmt: skip
        print(f"random circuits ({args.random}): CPR {base.cpr_mean:.4f} ± {base.cpr_std:.4f}, "
              f"CMD {base.cmd_mean:.4f} ± {base.cmd_std:.4f}")  # fmt: skip
    from ...files import write_atomic

    write_atomic(folder / "mib_score.json", json.dumps(report, indent=1))
    print(f"wrote {path} and {folder / 'mib_score.json'}")
    return 0


def run_check(args: argparse.Namespace, load_model: Callable[[str], Any]) -> int:
    """`interp-gpt mib-check FOLDER [--model M]`; 0 when nothing is missing, else 1."""
    from .format import check_mib_submission

    model = load_model(args.model) if args.model else None
    problems = check_mib_submission(args.folder, model)
    for p in problems:
        print(f"- {p}")
    if not problems:
        print(f"{args.folder}: nothing missing")
    return 1 if problems else 0


# (name, help, description, examples, add_arguments, run(args, load_model)) for the interp-gpt parser
SUBCOMMANDS = [
    ("mib-score", SCORE_HELP, SCORE_DESCRIPTION, SCORE_EXAMPLES, add_score_arguments, run_score),
    ("mib-check", CHECK_HELP, CHECK_DESCRIPTION, CHECK_EXAMPLES, add_check_arguments, run_check),
]
