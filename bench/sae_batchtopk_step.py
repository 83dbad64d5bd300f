"""One training step of the topk family, ours vs sae-lens', on the same random batch, in one run.

    PYTHONPATH=. python bench/sae_batchtopk_step.py [--d-in 768] [--d-sae 24576] [--k 64] [--batch 4096]
        [--steps 5] [--repeats 3] [--threads T] [--arch topk_rescaled batchtopk matryoshka]

Needs sae-lens 6 in the same environment. Each side trains the same SAE (same weights, rescaled by
the decoder norms, sae-lens' aux coefficient 1.0, a tenth of the features dead so AuxK runs) for
`--steps` steps on one fixed batch `[batch, d_in]`:
  ours      `SAETrainer.step(x)` (clip_grad_norm=1.0, normalize_decoder=False: sae-lens' options);
  sae-lens  `training_forward_pass(TrainStepInput(...))`, backward, `clip_grad_norm_(params, 1.0)`,
            Adam step, as its SAETrainer._train_step does (no activation store on either side).
Timed in interleaved rounds; prints tokens/s of the medians and the ratio ours / sae-lens'. Run it at
the default (GPT-2 small) size on a quiet machine; `--toy` checks that it runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any

import torch

HOOK = "blocks.8.hook_resid_pre"


def build(arch: str, d_in: int, d_sae: int, k: int, seed: int = 0) -> tuple[Any, Any]:
    """(our SAE, sae-lens' training SAE) holding the same random tensors."""
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata

    from interp_gpt.sae import SAE, SAEConfig

    widths = [d_sae // 16, d_sae // 4, d_sae]
    ours_arch = {"topk_rescaled": "topk", "batchtopk": "batchtopk", "matryoshka": "matryoshka_batchtopk"}[arch]
    extra: dict[str, Any] = {"matryoshka_widths": widths} if arch == "matryoshka" else {}
    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=ours_arch, k=k, rescale_acts_by_decoder_norm=True,
                        metadata={"hook_name": HOOK}, **extra))  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 / d_in**0.5 if name.startswith("W") else 0.01))
    names = {"topk": "TopKTrainingSAE", "batchtopk": "BatchTopKTrainingSAE",
             "matryoshka_batchtopk": "MatryoshkaBatchTopKTrainingSAE"}  # fmt: skip
    cfg = getattr(sae_lens, names[ours_arch] + "Config")(
        d_in=d_in, d_sae=d_sae, k=k, rescale_acts_by_decoder_norm=True, aux_loss_coefficient=1.0,
        metadata=SAEMetadata(hook_name=HOOK), **extra,
    )  # fmt: skip
    twin = getattr(sae_lens, names[ours_arch])(cfg)
    twin.load_state_dict(sae.state_dict())
    return sae, twin


def time_ours(sae: Any, x: torch.Tensor, dead: torch.Tensor, steps: int) -> float:
    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-4, clip_grad_norm=1.0, init_weights=False,
                                                normalize_decoder=False, aux_coefficient=1.0, keep_last_good=False))  # fmt: skip
    start = time.perf_counter()
    for _ in range(steps):
        trainer.steps_since_fired[dead] = trainer.cfg.dead_feature_window
        trainer.step(x)
    return time.perf_counter() - start


def time_saelens(twin: Any, x: torch.Tensor, dead: torch.Tensor, steps: int) -> float:
    from sae_lens.saes.sae import TrainStepInput

    opt = torch.optim.Adam(twin.parameters(), lr=1e-4)
    start = time.perf_counter()
    for i in range(steps):
        out = twin.training_forward_pass(
            TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=dead, n_training_steps=i, is_logging_step=False)
        )
        with torch.no_grad():  # its trainer's firing count
            _ = out.feature_acts.bool().float().sum(-2).bool()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-in", type=int, default=768)
    p.add_argument("--d-sae", type=int, default=24576)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--arch", nargs="+", default=["topk_rescaled", "batchtopk", "matryoshka"])
    p.add_argument("--toy", action="store_true", help="tiny sizes, one round: check that it runs")
    args = p.parse_args(argv)
    if args.toy:
        args.d_in, args.d_sae, args.k, args.batch, args.steps, args.repeats = 16, 128, 4, 64, 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    x = torch.randn(args.batch, args.d_in, generator=torch.Generator().manual_seed(1))
    dead = torch.zeros(args.d_sae, dtype=torch.bool)
    dead[::10] = True
    print(f"d_in {args.d_in}, d_sae {args.d_sae}, k {args.k}, batch {args.batch} rows, {args.steps} steps a round, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}")  # fmt: skip
    for arch in args.arch:
        times: dict[str, list[float]] = {"ours": [], "sae-lens": []}
        for _ in range(args.repeats + 1):  # the first round warms up
            sae, twin = build(arch, args.d_in, args.d_sae, args.k)
            times["ours"].append(time_ours(sae, x, dead, args.steps))
            times["sae-lens"].append(time_saelens(twin, x, dead, args.steps))
        med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in times.items()}
        tps = {k: args.batch * args.steps / v for k, v in med.items()}
        print(f"{arch}: tokens/s ours {tps['ours']:.0f}, sae-lens {tps['sae-lens']:.0f}; "
              f"ratio {tps['ours'] / tps['sae-lens']:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
