"""Tuned-lens training throughput on a GPT-2-small-shaped random model: interp_gpt's `fit_tuned_lens` vs
tuned-lens 0.2's training step, in one run.

    PYTHONPATH=. python bench/tuned_lens_training.py [--steps S] [--batch B] [--pos P] [--repeats R] [--threads T]

Both train the same lens (12 translators, SGD with Nesterov momentum, lr 0.1, weight decay 1e-3, linear
decay, gradients clipped to 1) with the KL objective on the same random token windows `[B, P]`, fp32,
for S steps:
  ours        `fit_tuned_lens(model, tokens, steps=S, batch_size=B)` on our raw-weights copy of the
              checkpoint (one `run_with_cache` per step, then each layer's loss back-propagated in turn);
  tuned-lens  the body of its `scripts/train_loop.py` (which no longer imports: it needs the removed
              `torchdata.dataloader2`), written out: `hf(tokens, output_hidden_states=True)` under
              no_grad, `lens(h, idx=i)` and the KL per layer, backward per layer, clip, step, schedule;
              in fp32 (its loop autocasts the lens to bfloat16, which on a CPU measures bfloat16 matmuls).
              Needs tuned-lens and transformers; without them only ours is timed.
Each side is timed end to end in interleaved rounds (building the lens and optimiser included, loading the
model not); tokens/s = S * B * P / median seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def theirs(hf, tokens, steps: int):  # type: ignore[no-untyped-def]
    """tuned-lens 0.2's training step (KL loss, token shift 0, one GPU's batch, no accumulation)."""
    import torch
    from transformers import get_linear_schedule_with_warmup
    from tuned_lens import TunedLens

    lens = TunedLens.from_model(hf)
    opt = torch.optim.SGD(lens.parameters(), lr=1.0 * (1 - 0.9), momentum=0.9, nesterov=True, weight_decay=1e-3)
    scheduler = get_linear_schedule_with_warmup(opt, 0, steps)
    for _ in range(steps):
        with torch.no_grad():
            output = hf(tokens, output_hidden_states=True)
        labels = output.logits.float().log_softmax(dim=-1)
        for i, h in enumerate(output.hidden_states[:-1]):
            logits = lens(h, idx=i)
            loss = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        scheduler.step()
    return lens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3, help="optimiser steps per timed run (default 3)")
    p.add_argument("--batch", type=int, default=2, help="windows per step (default 2)")
    p.add_argument("--pos", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument("--repeats", type=int, default=2, help="timed rounds (default 2, after 1 warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", help="also write the raw times here")
    args = p.parse_args(argv)

    import torch
    from _common import checkpoint, interleaved, median, random_tokens

    from interp_gpt import GPT
    from interp_gpt.lenses import fit_tuned_lens

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    folder, how = checkpoint()
    model = GPT.from_pretrained_no_processing(folder, tokenizer=None).eval()
    tokens = random_tokens(args.batch, args.pos)
    fns = {"ours": lambda: fit_tuned_lens(model, tokens, steps=args.steps, batch_size=args.batch, progress=False)}
    try:
        import tuned_lens  # noqa: F401
        from transformers import GPT2LMHeadModel

        hf = GPT2LMHeadModel.from_pretrained(folder).eval()
        fns["tuned-lens"] = lambda: theirs(hf, tokens, args.steps)
    except ImportError as e:
        print(f"tuned-lens not timed ({e})")
    times = interleaved(fns, args.repeats)
    n_tokens = args.steps * args.batch * args.pos
    print(
        f"tuned-lens training, GPT-2-small shape ({how}), {args.steps} steps of {args.batch}x{args.pos} tokens, "
        f"fp32, {args.threads} thread(s), median of {args.repeats}"
    )
    rates = {name: n_tokens / median(t) for name, t in times.items()}
    for name, rate in rates.items():
        print(f"  {name:<11} {median(times[name]):7.2f} s   {rate:8.1f} tokens/s")
    if "tuned-lens" in rates:
        print(f"  ratio ours / tuned-lens: {rates['ours'] / rates['tuned-lens']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "times": times}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
