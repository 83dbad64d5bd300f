"""One training step of a JumpReLU and of a Gated SAE: interp_gpt's SAETrainer vs sae-lens' training SAE.

    PYTHONPATH=. python bench/sae_arch_steps.py [--d-in 768] [--d-sae 16384] [--batch 4096] [--l0 64]
                                                [--steps 10] [--repeats 3] [--threads T]

Needs sae-lens 6. Both sides start from the same weights, set so that about `--l0` features fire per row
(a trained SAE's regime, where our step runs on the positions that fire), and take `--steps` steps on
the same random batches: ours `SAETrainer.step` (clip_grad_norm=1.0), sae-lens' its trainer's inner step
(`training_forward_pass`, backward, clip to 1.0, Adam). No model, no activation store: the SAE's own
work. Interleaved rounds; the ratio is ours / sae-lens' rows/s of the medians (the issue's goal: >= 1.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings


def weights(arch: str, d_in: int, d_sae: int, l0: int, x: object) -> dict:  # type: ignore[type-arg]
    """Random weights whose gate (threshold / b_gate) lets about `l0` features per row of `x` through."""
    import torch

    g = torch.Generator().manual_seed(0)
    w_dec = torch.nn.functional.normalize(torch.randn(d_sae, d_in, generator=g), dim=-1) * 0.1
    state = {"W_dec": w_dec, "W_enc": w_dec.T.contiguous(), "b_dec": torch.zeros(d_in)}
    pre = x @ state["W_enc"]  # type: ignore[operator]
    cut = pre[:512].quantile(1 - l0 / d_sae, dim=0)  # per feature: it fires on a share l0 / d_sae of the rows
    if arch == "jumprelu":
        state.update(b_enc=torch.zeros(d_sae), threshold=cut.clamp(min=1e-3))
    else:
        state.update(b_gate=-cut, b_mag=torch.zeros(d_sae), r_mag=torch.zeros(d_sae))
    return state


def ours(arch: str, state: dict, batches: list, d_in: int, d_sae: int) -> float:  # type: ignore[type-arg]
    from interp_gpt.sae import SAE, SAEConfig
    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=arch, metadata={"hook_name": "blocks.0.hook_resid_pre"}))
    sae.load_state_dict(state)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-4, clip_grad_norm=1.0, init_weights=False, log_every=10**9))
    start = time.perf_counter()
    for x in batches:
        trainer.step(x)
    return time.perf_counter() - start


def saelens(arch: str, state: dict, batches: list, d_in: int, d_sae: int) -> float:  # type: ignore[type-arg]
    import torch
    from sae_lens.saes.gated_sae import GatedTrainingSAE, GatedTrainingSAEConfig
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput

    if arch == "jumprelu":
        sae = JumpReLUTrainingSAE(JumpReLUTrainingSAEConfig(d_in=d_in, d_sae=d_sae))
        coefficients = {"l0": 1.0}
    else:
        sae = GatedTrainingSAE(GatedTrainingSAEConfig(d_in=d_in, d_sae=d_sae))  # type: ignore[assignment]
        coefficients = {"l1": 1.0}
    sae.load_state_dict(state)
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-4)
    dead = torch.zeros(d_sae, dtype=torch.bool)
    start = time.perf_counter()
    for x in batches:  # its trainer's _train_step, without the logging
        out = sae.training_forward_pass(TrainStepInput(x, coefficients, dead, 0, False))
        with torch.no_grad():
            out.feature_acts.bool().float().sum(-2).bool()  # its fired-feature count
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-in", type=int, default=768)
    p.add_argument("--d-sae", type=int, default=16384)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--l0", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(args.batch, args.d_in, generator=g) for _ in range(args.steps)]
    print(f"d_in {args.d_in}, d_sae {args.d_sae}, batch {args.batch} rows, ~{args.l0} features per row, "
          f"{args.steps} steps, {args.threads} thread(s), torch {torch.__version__}")  # fmt: skip
    for arch in ("jumprelu", "gated"):
        state = weights(arch, args.d_in, args.d_sae, args.l0, batches[0])
        ours(arch, state, batches[:1], args.d_in, args.d_sae)  # warm-up
        saelens(arch, state, batches[:1], args.d_in, args.d_sae)
        times: dict[str, list[float]] = {"ours": [], "sae-lens": []}
        for _ in range(args.repeats):
            times["ours"].append(ours(arch, state, batches, args.d_in, args.d_sae))
            times["sae-lens"].append(saelens(arch, state, batches, args.d_in, args.d_sae))
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["sae-lens"] / med["ours"]
        rows = args.batch * args.steps
        print(f"{arch}: rows/s ours {rows / med['ours']:.0f}, sae-lens {rows / med['sae-lens']:.0f}; ratio "
              f"{ratio:.2f} ({'PASS' if ratio >= 1.5 else 'MISS'}: goal >= 1.5)")  # fmt: skip
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other jobs share the machine: read the ratio)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
