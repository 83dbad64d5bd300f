"""Benchmark: our `eap_scores` against auto-circuit 1.0.1's EAP, same random GPT-2-small-shaped
weights and prompts, CPU, timed in one run (interleaved).

auto-circuit does not import beside transformer-lens 3.9 / 4.x, so this runs from its own venv
(`transformer-lens==2.18.0`, `datasets<3`, `pyarrow<18`, numpy 1.26, transformers 4.57), with our
package on PYTHONPATH (it imports there):

    python3 -m venv /work/venv-autocircuit
    /work/venv-autocircuit/bin/pip install torch==2.13.0
    /work/venv-autocircuit/bin/pip install auto-circuit==1.0.1 transformer-lens==2.18.0 "datasets<3" "pyarrow<18"
    PYTHONPATH=. /work/venv-autocircuit/bin/python bench/circuits_autocircuit.py [--batch 8] [--tokens 20]

The model: `GPT(preset("gpt2"))`, `init_weights(seed=0)` (as bench/circuits.py), its state dict
loaded into a transformer-lens 2.18 `HookedTransformer` of the same config (the same parameter
names) with `use_attn_result`, `use_split_qkv_input`, `use_hook_mlp_in` on, as auto-circuit needs.
auto-circuit's EAP: `patchable_model(tl, factorized=True, slice_output="last_seq",
separate_qkv=True)` (built once, not timed), then `mask_gradient_prune_scores(..., grad_function="logit",
answer_function="avg_diff", mask_val=0.0)` on one batch holding every prompt. Ours:
`eap_scores(model, clean, corrupted, metric)` with `metric = mean over prompts of
logit[last, answer] - logit[last, wrong]`, the same metric; auto-circuit's score is the gradient
of `-metric` by the edge mask at 0, i.e. `-(corrupted - clean) . grad`: ours negated. Its senders
are `hook_result` (z @ W_O, no b_O), `hook_mlp_out` (with b_out: cancels in corrupted - clean) and
`blocks.0.hook_resid_pre`; its receivers the q/k/v inputs, `hook_mlp_in` and the last
`hook_resid_post`: the edge graph and quantities are ours, so the scores are compared edge by edge.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import edge_hooked_transformer, interleaved, median, random_tokens  # noqa: E402

from interp_gpt import GPT, preset  # noqa: E402
from interp_gpt.circuits import Graph, eap_scores  # noqa: E402

ANSWER, WRONG = 1000, 2000


def metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()


def our_name(node: str) -> str:
    """auto-circuit's node names ("Resid Start", "A3.7", "A3.7.Q", "MLP 2", "Resid End") as ours."""
    if node == "Resid Start":
        return "input"
    if node == "Resid End":
        return "logits"
    if m := re.fullmatch(r"MLP (\d+)", node):
        return f"m{m.group(1)}"
    if m := re.fullmatch(r"A(\d+)\.(\d+)(?:\.([QKV]))?", node):
        return f"a{m.group(1)}.h{m.group(2)}" + (f"<{m.group(3).lower()}>" if m.group(3) else "")
    raise ValueError(f"unexpected auto-circuit node name {node!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import auto_circuit  # noqa: F401  (fails here, with its reason, where it is not installed)
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    model = GPT(preset("gpt2"))
    model.init_weights(seed=0)
    model.eval()
    graph = Graph.from_model(model)
    tl = edge_hooked_transformer(model, "cpu")

    clean = random_tokens(args.batch, args.tokens, seed=1)
    corrupted = random_tokens(args.batch, args.tokens, seed=2)
    with torch.no_grad():
        same = float((tl(clean) - model(clean)).abs().max())
    print(
        f"GPT-2-small shape, random weights, {args.batch}x{args.tokens} tokens, {graph.n_edges} edges, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); TL 2.18 vs our logits max |diff| {same:.1e}"
    )

    answers = [torch.tensor([ANSWER])] * args.batch
    wrong = [torch.tensor([WRONG])] * args.batch
    loader = PromptDataLoader(
        PromptDataset(clean, corrupted, answers, wrong), seq_len=None, diverge_idx=0, batch_size=args.batch
    )
    pm: Any = patchable_model(
        tl, factorized=True, slice_output="last_seq", separate_qkv=True, device=torch.device("cpu")
    )

    def theirs() -> dict[str, torch.Tensor]:
        pm.zero_grad(set_to_none=True)
        return mask_gradient_prune_scores(
            pm, loader, None, grad_function="logit", answer_function="avg_diff", mask_val=0.0
        )

    def ours() -> torch.Tensor:
        return eap_scores(model, clean, corrupted, metric)

    ps = theirs()
    mine = ours()
    their_scores = torch.full((graph.n_edges,), float("nan"))
    for edge in pm.edges:
        i = graph.edge_index(f"{our_name(edge.src.name)} -> {our_name(edge.dest.name)}")
        their_scores[i] = -ps[edge.dest.module_name][edge.patch_idx].float()
    n_matched = int((~their_scores.isnan()).sum())
    diff = float((their_scores - mine).abs().max())
    scale = float(mine.abs().max())
    print(
        f"edges: auto-circuit {len(pm.edges)}, ours {graph.n_edges}, matched {n_matched}; "
        f"max |ours - (-theirs)| {diff:.2e} (largest |score| {scale:.2e}; goal <= 1e-4: {'PASS' if diff <= 1e-4 else 'MISS'})"
    )

    t = interleaved({"auto-circuit EAP": theirs, "our eap_scores": ours}, repeats=args.repeats)
    a, b = median(t["auto-circuit EAP"]), median(t["our eap_scores"])
    print(
        f"auto-circuit mask_gradient_prune_scores {a:.3f} s | our eap_scores {b:.3f} s | "
        f"ratio ours/theirs {b / a:.2f} (goal <= 0.5: {'PASS' if b / a <= 0.5 else 'MISS'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
