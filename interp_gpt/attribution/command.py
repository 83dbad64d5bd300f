"""`interp-gpt attribute`: a prompt's attribution graph, written as the offline graph page (and graph JSON).

    interp-gpt attribute tiny-gpt2 "The cat sat on the mat because" --transcoders shipped --out graph.html
    interp-gpt attribute gpt2 "The capital of France is" --transcoders transcoders/gpt2 --out graph.html \\
        --json graph.json --max-feature-nodes 2000 --contexts-from data/corpus

--transcoders takes a transcoder set as `load_transcoders` reads it (a folder of sae-lens folders, one per
layer, as `interp-gpt train-transcoder --kind plt|skip` saves it; a circuit-tracer config.yaml or its
folder), a cross-layer transcoder folder (circuit-tracer's, as `--kind clt` saves it), or `shipped` /
`shipped-clt` for tiny-gpt2's own. Top-activating contexts are opt-in (--contexts-from a .txt file or a
folder of them, its validation tail as `interp-gpt features` reads it): the package ships no text corpus
(data/corpus lives in the repository, not in the wheel), and running the model over a corpus is the
slowest part of a page.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["HELP", "DESCRIPTION", "EXAMPLES", "add_arguments", "run"]

HELP = "a prompt's attribution graph through transcoders, as an offline page to explore (and graph JSON)"
DESCRIPTION = (
    "Attribute PROMPT's next-token logits to the transcoders' features, error nodes and token embeddings "
    "(circuit-tracer's attribution graph), then write an offline page: nodes by layer and position, live "
    "pruning sliders, node details (promoted tokens, top contexts with --contexts-from), pins and supernodes. "
    "--transcoders is a transcoder folder (sae-lens or circuit-tracer files, a CLT folder) or shipped / "
    "shipped-clt (tiny-gpt2's)."
)
EXAMPLES = [
    'tiny-gpt2 "The cat sat on the mat because" --transcoders shipped --out graph.html',
    'tiny-gpt2 "The cat sat on the mat because" --transcoders shipped-clt --out clt.html --json clt.json',
    "gpt2 'The capital of France is' --transcoders transcoders/gpt2 --out graph.html --contexts-from data/corpus",
]
SHIPPED = ("shipped", "shipped-clt")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `attribute` options."""
    p.add_argument("model", metavar="MODEL", help="tiny-gpt2, a hub id such as gpt2, a local folder or weights file")
    p.add_argument("prompt", metavar="PROMPT", help="the text whose next token is attributed (quote it)")
    p.add_argument(
        "--transcoders", required=True, metavar="PATH",
        help="a transcoder set (folder or config.yaml), a CLT folder, or shipped / shipped-clt (tiny-gpt2's)",
    )  # fmt: skip
    p.add_argument("--out", required=True, metavar="PAGE.html", help="the graph page to write")
    p.add_argument(
        "--json", metavar="GRAPH.json", help="also write circuit-tracer's graph JSON, pruned (default: none)"
    )
    p.add_argument("--slug", help="the graph's name (default: from the prompt)")
    p.add_argument(
        "--max-feature-nodes",
        type=int,
        metavar="N",
        help="at most N feature nodes, the most influential (default: no limit)",
    )
    p.add_argument("--max-n-logits", type=int, default=10, metavar="N", help="top logits attributed (default 10)")
    p.add_argument("--desired-logit-prob", type=float, default=0.95, metavar="P", help="or until they hold P")
    p.add_argument("--node-threshold", type=float, default=0.8, help="the page's first node threshold")
    p.add_argument("--edge-threshold", type=float, default=0.98, help="the page's first edge threshold")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="N",
        help="targets per backward pass (default: 16 on the CPU, 128 on a GPU)",
    )
    p.add_argument(
        "--no-check-memory",
        action="store_true",
        help="run even where the memory estimate says it will not fit (default: refuse, naming what fits)",
    )
    p.add_argument("--max-nodes", type=int, default=600, metavar="N", help="most nodes the page holds")
    p.add_argument(
        "--contexts-from", metavar="PATH", help="a .txt file or folder: each feature's top contexts (default: none)"
    )
    p.add_argument("--max-windows", type=int, default=64, metavar="N", help="64-token windows read (default 64)")


def _check(args: argparse.Namespace) -> None:
    """Every option that needs no model, checked before the model loads."""
    from ..checks import check_float, check_int_in_range

    if not args.prompt:
        raise ValueError("PROMPT is empty; give some text, e.g. 'The cat sat on the mat because'")
    check_float(args.node_threshold, "--node-threshold", 0.0, 0.99)
    check_float(args.edge_threshold, "--edge-threshold", 0.0, 0.999)
    check_float(args.desired_logit_prob, "--desired-logit-prob", 0.0, 1.0)
    for option in ("max_feature_nodes", "max_n_logits", "batch_size", "max_nodes", "max_windows"):
        value = getattr(args, option)
        if value is not None:
            check_int_in_range(value, "--" + option.replace("_", "-"), 1, None)
    if args.transcoders not in SHIPPED and not Path(args.transcoders).expanduser().exists():
        raise FileNotFoundError(
            f"--transcoders {args.transcoders!r}: no such file or folder (a transcoder folder, or shipped / shipped-clt)"
        )
    if args.contexts_from is not None and not Path(args.contexts_from).exists():
        raise FileNotFoundError(f"--contexts-from {args.contexts_from!r}: no such file or folder")
    for option in ("out", "json"):
        value = getattr(args, option)
        if value is not None and Path(value).is_dir():
            raise IsADirectoryError(f"--{option} {value!r} is a folder; expected a file path")


def load_transcoders_arg(path: str, model: Any) -> tuple[Any, str]:
    """(--transcoders' set, fitted to `model`, its name for the graph's `scan`); errors name the value."""
    from ..checks import BAD_INPUT, error_line
    from ..sae.training.data import SHIPPED_CLT_DIR, SHIPPED_TRANSCODERS_DIR
    from ..sae.transcoders.clt import CLT_EXT_KIND, CLT_KIND, load_clt
    from ..sae.transcoders.io import CT_CONFIG_FILENAME
    from ..sae.transcoders.transcoder import load_transcoders
    from ._inputs import check_transcoders

    folder = {"shipped": SHIPPED_TRANSCODERS_DIR, "shipped-clt": SHIPPED_CLT_DIR}.get(path, Path(path).expanduser())
    config = folder / CT_CONFIG_FILENAME if folder.is_dir() else folder
    try:
        kind = None
        if config.suffix in (".yaml", ".yml") and config.is_file():
            import yaml

            loaded = yaml.safe_load(config.read_text(encoding="utf-8"))
            kind = loaded.get("model_kind") if isinstance(loaded, dict) else None
        transcoders = load_clt(folder) if kind in (CLT_KIND, CLT_EXT_KIND) else load_transcoders(folder, model)
        check_transcoders(model, transcoders, caller="attribute")
    except (*BAD_INPUT, ImportError) as e:
        raise ValueError(f"--transcoders {path!r}: {error_line(e)}") from None
    return transcoders, folder.parent.name if folder.name == CT_CONFIG_FILENAME else folder.name


def _contexts(model: Any, path: str | None, max_windows: int) -> Any:
    """Token windows of --contexts-from (a folder: its validation tail), or None."""
    if path is None:
        return None
    from ..sae.training.data import held_out_texts, token_windows

    texts = held_out_texts(path, "--contexts-from")
    try:
        return token_windows(model, texts, min(64, int(model.cfg.n_ctx)), max_windows)
    except ValueError as e:
        raise ValueError(f"--contexts-from {path!r}: {e}") from None


def run(args: argparse.Namespace, load_model: Callable[[str], Any]) -> int:
    """`interp-gpt attribute MODEL PROMPT --transcoders PATH --out PAGE.html [...]`; returns 0."""
    _check(args)
    from .attribute import attribute
    from .graph_json import to_json
    from .prune import compute_graph_scores, prune_graph
    from .viewer import default_slug, graph_page

    model = load_model(args.model)
    transcoders, scan = load_transcoders_arg(args.transcoders, model)
    contexts = _contexts(model, args.contexts_from, args.max_windows)
    graph = attribute(
        model, args.prompt, transcoders, max_n_logits=args.max_n_logits, desired_logit_prob=args.desired_logit_prob,
        max_feature_nodes=args.max_feature_nodes, batch_size=args.batch_size, check_memory=not args.no_check_memory,
    )  # fmt: skip
    graph.scan = graph.scan or scan  # the set's own scan (circuit-tracer's config.yaml), else its path's name
    slug = args.slug or default_slug(graph)
    thresholds = {"node_threshold": args.node_threshold, "edge_threshold": args.edge_threshold}
    node_mask, edge_mask, _ = prune_graph(graph, **thresholds)
    replacement, completeness = compute_graph_scores(graph)
    print(
        f"{graph.n_pos} tokens, {graph.n_features} feature nodes, {graph.n_errors} error nodes, {graph.n_logits} "
        f"logits; pruned at {args.node_threshold} / {args.edge_threshold}: {int(node_mask.sum())} nodes, "
        f"{int(edge_mask.sum())} edges; replacement score {replacement:.3f}, completeness {completeness:.3f}"
    )
    page = graph_page(
        graph, args.out, model=model, transcoders=transcoders, contexts=contexts, slug=slug,
        max_nodes=args.max_nodes, **thresholds,
    )  # fmt: skip
    print(f"wrote {page}")
    if args.json:
        print(f"wrote {to_json(graph, args.json, slug=slug, tokenizer=model.tokenizer, scan=scan, **thresholds)}")
    return 0
