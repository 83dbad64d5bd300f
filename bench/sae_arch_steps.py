"""SAE training steps per architecture: interp_gpt's SAETrainer.step vs sae-lens' training step, in one run.

    PYTHONPATH=. python bench/sae_arch_steps.py [--arch abstopk matching_pursuit topk] [--d-in 128]
        [--d-sae 1024] [--k 32] [--max-iterations 32] [--batch 4096] [--steps 10] [--repeats 3] [--threads 1]

Needs sae-lens 6. Each side trains the same SAE (the same weights) on the same batches of planted sparse
rows (signed mixtures of 4 * d_in unit directions, about 1.5% on): ours `SAETrainer.step` (clip 1.0 as
sae-lens, the architecture's default decoder handling); sae-lens its `*TrainingSAE.training_forward_pass`
with its trainer's dead-feature mask and bookkeeping, backward, clip 1.0, Adam step, zero_grad, as
`SAETrainer._train_step` does. Rounds are interleaved; the ratio is of the median tokens/s (goal >= 1.5).
Run it once at toy size to see that it works (`--d-sae 256 --batch 512 --steps 2 --repeats 1`); the
numbers mean something only on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

HOOK = "blocks.1.hook_resid_pre"


def planted(n: int, d_in: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    dirs = torch.nn.functional.normalize(torch.randn(4 * d_in, d_in, generator=g), dim=-1)
    on = torch.rand(n, 4 * d_in, generator=g) < 0.015
    sign = torch.where(torch.rand(n, 4 * d_in, generator=g) < 0.5, -1.0, 1.0)
    return (on * sign * (1 + torch.rand(n, 4 * d_in, generator=g))) @ dirs


def their_sae(arch: str, a: argparse.Namespace) -> Any:
    """sae-lens' training SAE of `arch` with the bench's shape."""
    from sae_lens.saes.abstopk_sae import AbsTopKTrainingSAE, AbsTopKTrainingSAEConfig
    from sae_lens.saes.matching_pursuit_sae import MatchingPursuitTrainingSAE, MatchingPursuitTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

    shape = dict(d_in=a.d_in, d_sae=a.d_sae)
    if arch == "topk":
        return TopKTrainingSAE(TopKTrainingSAEConfig(**shape, k=a.k, rescale_acts_by_decoder_norm=False))
    if arch == "abstopk":
        return AbsTopKTrainingSAE(AbsTopKTrainingSAEConfig(**shape, k=a.k, rescale_acts_by_decoder_norm=False))
    if arch == "matching_pursuit":
        return MatchingPursuitTrainingSAE(MatchingPursuitTrainingSAEConfig(**shape, max_iterations=a.max_iterations))
    raise SystemExit(f"--arch {arch}: this bench knows topk, abstopk, matching_pursuit")


def our_sae(arch: str, a: argparse.Namespace) -> Any:
    from interp_gpt.sae import SAE, SAEConfig

    own = {"k": a.k} if "topk" in arch else {"max_iterations": a.max_iterations}
    return SAE(SAEConfig(d_in=a.d_in, d_sae=a.d_sae, architecture=arch, metadata={"hook_name": HOOK}, **own))


def runs(arch: str, a: argparse.Namespace, batches: list[torch.Tensor]) -> dict[str, Callable[[], float]]:
    """{"ours": ..., "sae-lens": ...}: each trains a fresh copy of the same SAE on `batches`; returns seconds."""
    from sae_lens.saes.sae import TrainStepInput

    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

    start = our_sae(arch, a)
    start.arch.init_weights(SAETrainer(start, SAETrainingConfig(seed=0)), batches[0])  # the training init
    state = {k: v.clone() for k, v in start.state_dict().items()}

    def ours() -> float:
        sae = our_sae(arch, a)
        sae.load_state_dict(state)
        trainer = SAETrainer(sae, SAETrainingConfig(lr=2e-3, init_weights=False, clip_grad_norm=1.0, log_every=10**9))
        t = time.perf_counter()
        for x in batches:
            trainer.step(x)
        return time.perf_counter() - t

    def theirs() -> float:
        sae = their_sae(arch, a)
        sae.load_state_dict(state)
        optimizer = torch.optim.Adam(sae.parameters(), lr=2e-3, betas=(0.9, 0.999))
        since_fired = torch.zeros(a.d_sae)
        t = time.perf_counter()
        for step, x in enumerate(batches):
            out = sae.training_forward_pass(
                TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=(since_fired > 200).bool(),
                               n_training_steps=step, is_logging_step=False)
            )  # fmt: skip
            with torch.no_grad():
                since_fired += 1
                since_fired[out.feature_acts.bool().float().sum(-2).bool()] = 0
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        return time.perf_counter() - t

    return {"ours": ours, "sae-lens": theirs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", nargs="+", default=["abstopk", "matching_pursuit", "topk"])
    p.add_argument("--d-in", type=int, default=128)
    p.add_argument("--d-sae", type=int, default=1024)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--max-iterations", type=int, default=32, help="matching pursuit's (sae-lens' default: d_in)")
    p.add_argument("--batch", type=int, default=4096, help="rows (tokens) per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    batches = [planted(a.batch, a.d_in, seed) for seed in range(a.steps)]
    print(f"d_in {a.d_in}, d_sae {a.d_sae}, k {a.k}, max_iterations {a.max_iterations}; {a.steps} steps of "
          f"{a.batch} rows, {a.threads} thread(s), torch {torch.__version__}")  # fmt: skip
    for arch in a.arch:
        fns = runs(arch, a, batches)
        for fn in fns.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(a.repeats):
            for name, fn in fns.items():
                times[name].append(fn())
        tps = {name: a.steps * a.batch / statistics.median(t) for name, t in times.items()}
        ratio = tps["ours"] / tps["sae-lens"]
        print(f"{arch:>17}: tokens/s ours {tps['ours']:.0f}, sae-lens {tps['sae-lens']:.0f}; ratio {ratio:.2f} "
              f"({'PASS' if ratio >= 1.5 else 'MISS'}: goal >= 1.5)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
