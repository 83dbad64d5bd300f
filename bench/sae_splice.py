"""Spliced-SAE forward passes: interp_gpt against sae-lens' HookedSAETransformer, one run, ratios.

A GPT-2-small-shaped model with random weights (the same state dict in both), a random standard SAE
of GPT-2 res-jb's shape (768 -> 24576) at blocks.6.hook_resid_pre, spliced with the error term;
timed interleaved (median of repeats), one thread, no grad. Needs sae-lens (transformer-lens 3.9):

    python bench/sae_splice.py [--batch 4 --pos 128 --repeats 5 --d-sae 24576]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from interp_gpt import GPT, Config
from interp_gpt.sae import SAE, SAEConfig

HOOK = "blocks.6.hook_resid_pre"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--pos", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--d-sae", type=int, default=24576)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import sae_lens
    from transformer_lens import HookedTransformerConfig

    model = GPT(Config()).eval()
    model.init_weights(seed=0)
    c = model.cfg
    hst = sae_lens.HookedSAETransformer(
        HookedTransformerConfig(
            n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head, d_mlp=c.d_mlp,
            d_vocab=c.d_vocab, n_ctx=c.n_ctx, act_fn=c.act_fn, eps=c.layer_norm_eps, normalization_type="LN",
        )
    ).eval()  # fmt: skip
    hst.load_state_dict(model.state_dict(), strict=False)
    sae = SAE(SAEConfig(d_in=768, d_sae=args.d_sae, metadata={"hook_name": HOOK}))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
    twin = sae_lens.SAE.from_dict(sae.cfg.to_dict())
    twin.load_state_dict(sae.state_dict())
    tokens = torch.randint(0, 50000, (args.batch, args.pos), generator=torch.Generator().manual_seed(0))
    feats = HOOK + ".hook_sae_acts_post"

    cases: dict[str, Callable[[], object]] = {
        "interp_gpt, no SAE": lambda: model(tokens),
        "interp_gpt, spliced (error term)": lambda: model.run_with_saes(tokens, saes=[sae], use_error_term=True),
        "interp_gpt, spliced, cache features": lambda: model.run_with_cache_with_saes(
            tokens, saes=[sae], use_error_term=True, names_filter=feats
        ),
        "sae-lens HookedSAETransformer, no SAE": lambda: hst(tokens),
        "sae-lens, spliced (error term)": lambda: hst.run_with_saes(tokens, saes=[twin], use_error_term=True),
        "sae-lens, spliced, cache features": lambda: hst.run_with_cache_with_saes(
            tokens, saes=[twin], use_error_term=True, names_filter=feats
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    with torch.no_grad():
        ours = model.run_with_saes(tokens, saes=[sae], use_error_term=True)
        theirs = hst.run_with_saes(tokens, saes=[twin], use_error_term=True)
        print(f"max |logit difference| ours vs sae-lens: {float((ours - theirs).abs().max()):.2e}")
        for _ in range(args.repeats):
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"batch {args.batch} x {args.pos} tokens, d_sae {args.d_sae}, 1 thread, median of {args.repeats}")
    for k, v in med.items():
        print(f"  {k:40s} {v * 1000:8.1f} ms")
    for a, b in [
        ("spliced (error term)", "spliced (error term)"),
        ("spliced, cache features", "spliced, cache features"),
    ]:
        print(f"  sae-lens / interp_gpt, {a}: {med['sae-lens, ' + b] / med['interp_gpt, ' + a]:.2f}x")


if __name__ == "__main__":
    main()
