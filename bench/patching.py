"""Benchmark: activation patching of resid_pre, ours (batched) vs transformer-lens, and
attribution patching, on the GPT-2-small shape with random weights, CPU.

    python bench/patching.py [--tokens 20] [--repeats 3] [--tl-repeats 2]

One run prints: transformer-lens' `get_act_patch_resid_pre` time, ours, attribution
patching's, the ratios (ours/TL, attribution/TL; goals: <= 1/4 and <= 1/40), and checks
that our result equals transformer-lens' (max |diff| < 1e-4).

Both sides run under torch.no_grad() (transformer-lens' fastest setting; ours uses it
internally anyway) with their progress bars off, so neither pays for gradient tracking
or terminal output. Times are medians of the repeats after one warm-up run.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch


def build_checkpoint(
    folder: Path, seed: int = 0, n_layer: int = 12, n_embd: int = 768, n_head: int = 12, n_positions: int = 1024
) -> Path:
    """A Hugging Face GPT-2 checkpoint (GPT-2-small-shaped by default), seeded random weights;
    LayerNorm weights and biases get noise so weight processing has work to do."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=50257, n_positions=n_positions, n_ctx=n_positions
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f") or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(folder)
    return folder


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall time of `repeats` calls (after the caller's warm-up) and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="repeats for ours and attribution (median)")
    parser.add_argument("--tl-repeats", type=int, default=2, help="repeats for transformer-lens (median)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    import transformer_lens.patching as tl_patching
    from tqdm.auto import tqdm

    from interp_gpt import from_pretrained, patching
    from interp_gpt.compare import to_transformer_lens, transformer_lens_version
    from interp_gpt.metrics import logit_diff

    load_before = os.getloadavg()  # other work on the machine skews the ratios: check it is low
    tmp = tempfile.TemporaryDirectory()
    folder = build_checkpoint(Path(tmp.name) / "gpt2-small-random")
    ours = from_pretrained(folder, tokenizer=None)
    tl = to_transformer_lens(folder, processed=True)
    tl_patching.tqdm = functools.partial(tqdm, disable=True)  # its progress bar off, as ours

    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 50257, (1, args.tokens), generator=gen)
    corrupted = torch.randint(0, 50257, (1, args.tokens), generator=gen)
    answers = torch.tensor([[int(clean[0, -1]), int(corrupted[0, -1])]])
    metric = functools.partial(logit_diff, answer_tokens=answers)  # the same function for both
    resid_pre = [f"blocks.{layer}.hook_resid_pre" for layer in range(12)]

    with torch.no_grad():
        _, tl_cache = tl.run_with_cache(clean, names_filter=lambda n: n in resid_pre)
        _, our_cache = ours.run_with_cache(clean, names_filter=resid_pre)

        def run_tl():
            return tl_patching.get_act_patch_resid_pre(tl, corrupted, tl_cache, metric)

        def run_ours():
            return patching.get_act_patch_resid_pre(ours, corrupted, our_cache, metric, progress=False)

        for _ in range(3):  # transformer-lens warm-up: a few forwards (a whole sweep is slow)
            tl(corrupted)
        t_tl, tl_result = timed(run_tl, args.tl_repeats)
        run_ours()
        t_ours, our_result = timed(run_ours, args.repeats)

    def run_attribution():
        return patching.attribution_patch(ours, clean, corrupted, metric, sweeps=["resid_pre"])

    def run_attribution_all():
        return patching.attribution_patch(ours, clean, corrupted, metric)

    run_attribution()
    t_attr, attribution = timed(run_attribution, args.repeats)
    run_attribution_all()
    t_attr_all, _ = timed(run_attribution_all, args.repeats)
    comparison = patching.attribution_vs_activation_patching(
        ours, clean, corrupted, metric, "resid_pre", attribution=attribution
    )

    max_diff = float((our_result - tl_result).abs().max())
    n_layers, n_pos = our_result.shape
    print(
        f"activation patching, resid_pre: {n_layers} layers x {n_pos} positions = {n_layers * n_pos} patches; "
        f"GPT-2-small shape, random weights (processed), batch 1 x {args.tokens} tokens"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; transformer-lens {transformer_lens_version()} "
        f"({type(tl).__name__}); python {sys.version.split()[0]}; "
        f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"{'':<32}{'time (s)':>10}{'vs TL':>10}{'goal':>8}")
    print(f"{'transformer-lens (1 run/patch)':<32}{t_tl:>10.3f}{1.0:>10.3f}{'':>8}   median of {args.tl_repeats}")
    print(f"{'interp_gpt (batched)':<32}{t_ours:>10.3f}{t_ours / t_tl:>10.3f}{'0.25':>8}   median of {args.repeats}")
    print(f"{'interp_gpt attribution':<32}{t_attr:>10.3f}{t_attr / t_tl:>10.4f}{'0.025':>8}   median of {args.repeats}")
    print(
        f"{'  (all 16 estimate kinds)':<32}{t_attr_all:>10.3f}{t_attr_all / t_tl:>10.4f}{'':>8}   "
        "resid_pre/mid/post, attn_out, mlp_out, every head's z/q/k/v/pattern"
    )
    print(f"ours vs transformer-lens: max |diff| = {max_diff:.2e} (must be < 1e-4)")
    print(f"attribution vs activation patching (resid_pre): Pearson r = {comparison.correlation:.3f}")
    print(
        f"speed-up: ours {t_tl / t_ours:.1f}x, attribution {t_tl / t_attr:.0f}x; goals met: "
        f"ours {'yes' if t_ours <= t_tl / 4 else 'NO'}, attribution {'yes' if t_attr <= t_tl / 40 else 'NO'}"
    )
    assert max_diff < 1e-4, f"our resid_pre sweep differs from transformer-lens' by {max_diff:.2e}"
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
