"""Training quality on synthetic ground truth: interp_gpt's SAETrainer vs sae-lens' SAETrainer, per architecture,
on the same samples with the same budget, over several seeds, both scored by interp_gpt's `evaluate_synthetic`
(equal to sae-lens' `eval_sae_on_synthetic_data`: tests/test_sae_synthetic.py's parity tests).

    PYTHONPATH=. /tmp/venv-tl3/bin/python bench/sae_synthetic_quality.py [--arch topk,standard,...] [--seeds 3]
        [--num-features 256] [--hidden-dim 64] [--steps 500] [--batch 1024] [--lr 3e-3] [--threads 2] [--clip]
        [--json out.json]

Needs sae-lens 6 (its venv: transformer-lens 3.9). The data: the main model of `interp-gpt sae-bench`
(`SyntheticBench`: superposition, a hierarchy, low-rank correlations), one list of batches per seed, fed to both
trainers. The settings: the sae-bench table (`interp_gpt.sae.benchmark.recipes`) resolved at the data's true L0
and activation scale, given to both (k, matryoshka widths, max_iterations, l1 / l0 coefficients, JumpReLU's loss
mode), the AuxK weight at sae-lens' default (1.0) for both; everything else each trainer's own default (ours: a
unit-norm decoder for the topk family, no gradient clipping, b_dec at the first batch's mean; sae-lens:
rescale_acts_by_decoder_norm, decoder rows of norm 0.1, b_dec 0, the gradient norm clipped to 1.0; `--clip` clips
ours too). Both start from seeds mixed by `init_seed` (an SAE seeded like the dictionary would start at the
answer). Both are scored as saved for inference (ours `save_model` + `SAE.from_pretrained`, sae-lens'
`save_inference_model` + `SAE.load_from_disk`) on the same evaluation samples.

The check (issue 37): ours at least sae-lens' within noise: PASS when our mean MCC >= sae-lens' mean minus two
standard errors of the difference (std over seeds / sqrt(seeds), both sides).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # sae-lens' progress bar, not asked for here
AUX = 1.0  # the AuxK weight for both (sae-lens' default; ours is 1/32)


def _resolved(arch: str, d_in: int, d_sae: int, target_l0: int, scale: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SAE config fields, training fields) of the sae-bench table for `arch`, resolved for this data."""
    from interp_gpt.sae.benchmark.recipes import build, recipe

    sae, cfg = build(arch, recipe(arch), d_in, d_sae, target_l0, scale, "synthetic", {})
    own = sae.arch.fields
    sae_fields = {name: getattr(sae.cfg, name) for name in own}
    training = {name: getattr(cfg, name) for name in recipe(arch) if name not in own}
    return sae_fields, training


def ours(arch: str, data: list[Any], seed: int, fields: tuple[dict[str, Any], dict[str, Any]], args: Any) -> Any:
    from interp_gpt.sae import SAE, SAEConfig
    from interp_gpt.sae.benchmark.recipes import deployed, init_seed
    from interp_gpt.sae.training import SAETrainer, SAETrainingConfig

    sae_fields, training = fields
    aux = {"aux_coefficient": AUX} if "k" in sae_fields else {}
    sae = SAE(SAEConfig(d_in=args.hidden_dim, d_sae=args.num_features, architecture=arch,
                        metadata={"hook_name": "synthetic"}, **sae_fields))  # fmt: skip
    clip = {"clip_grad_norm": 1.0} if args.clip else {}
    cfg = SAETrainingConfig(lr=args.lr, seed=init_seed(seed), log_every=len(data), **training, **aux, **clip)
    SAETrainer(sae, cfg).train(iter(data), len(data), progress=False)
    return deployed(sae)


def saelens(arch: str, data: list[Any], seed: int, fields: tuple[dict[str, Any], dict[str, Any]], args: Any) -> Any:
    import dataclasses

    import torch
    from sae_lens import SAE as SaeLensSAE
    from sae_lens.config import SAETrainerConfig
    from sae_lens.registry import get_sae_training_class
    from sae_lens.training.sae_trainer import SAETrainer

    from interp_gpt.sae.benchmark.recipes import init_seed

    cls, cfg_cls = get_sae_training_class(arch)
    known = {f.name for f in dataclasses.fields(cfg_cls)}
    sae_fields, training = fields
    kwargs = {**sae_fields, **training, "aux_loss_coefficient": AUX}
    kwargs = {k: v for k, v in kwargs.items() if k in known and k != "rescale_acts_by_decoder_norm"}  # its default
    torch.manual_seed(init_seed(seed))  # sae-lens initialises from torch's global generator
    sae = cls(cfg_cls(d_in=args.hidden_dim, d_sae=args.num_features, **kwargs))
    n = len(data) * args.batch
    cfg = SAETrainerConfig(total_training_samples=n, train_batch_size_samples=args.batch, lr=args.lr, lr_end=args.lr,
                           dead_feature_window=200, feature_sampling_window=400)  # fmt: skip
    SAETrainer(cfg, sae, data_provider=iter(data)).fit()
    with tempfile.TemporaryDirectory() as folder:
        sae.save_inference_model(folder)
        return SaeLensSAE.load_from_disk(folder)


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="", help="comma-separated architectures (default: every one both train)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--num-features", type=int, default=256, help="true features, and d_sae")
    p.add_argument("--hidden-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-samples", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clip", action="store_true", help="clip our gradient norm to 1.0 too, as sae-lens' trainer does")
    p.add_argument("--json", help="also write every score here")
    args = p.parse_args(argv)

    from importlib.metadata import version

    import torch
    from sae_lens.registry import get_sae_training_class

    from interp_gpt.sae.benchmark import SyntheticBench, trainable_architectures
    from interp_gpt.sae.benchmark.synthetic import EVAL_SEED, ground_truth, synthetic_batches
    from interp_gpt.sae.synthetic import evaluate_synthetic

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    bench = SyntheticBench(num_features=args.num_features, hidden_dim=args.hidden_dim, steps=args.steps,
                           batch_size=args.batch, lr=args.lr, eval_samples=args.eval_samples)  # fmt: skip
    model = bench.main_model()
    true_l0, target_l0, scale = ground_truth(model)
    archs = [a for a in (args.arch.split(",") if args.arch else trainable_architectures())]
    for arch in archs:
        try:
            get_sae_training_class(arch)
        except (KeyError, ValueError):
            print(f"{arch}: sae-lens does not train it", file=sys.stderr)
            return 2
    clip = "; ours clipped to 1.0 too" if args.clip else ""
    print(f"synthetic: {args.num_features} features in {args.hidden_dim} dims, true L0 {true_l0:.2f} (target "
          f"{target_l0}), scale {scale:.3f}; {args.steps} steps of {args.batch}, lr {args.lr:g}, {args.seeds} seeds; "
          f"sae-lens {version('sae-lens')}, torch {torch.__version__}, {args.threads} thread(s); load average "
          f"{os.getloadavg()[0]:.1f}{clip}", flush=True)  # fmt: skip
    data = {s: list(itertools.islice(synthetic_batches(model, args.batch, 1000 + s), args.steps))
            for s in range(args.seeds)}  # fmt: skip
    n_eval = args.eval_samples
    results: dict[str, Any] = {}
    print(f"{'architecture':22s} {'MCC ours':>16s} {'MCC sae-lens':>16s} {'L0 ours/sae-lens':>18s} "
          f"{'dead ours/sae-lens':>19s}  verdict")  # fmt: skip
    for arch in archs:
        fields = _resolved(arch, args.hidden_dim, args.num_features, target_l0, scale)
        scores: dict[str, list[dict[str, Any]]] = {"ours": [], "sae-lens": []}
        seconds = {"ours": 0.0, "sae-lens": 0.0}
        for seed in range(args.seeds):
            for name, train in (("ours", ours), ("sae-lens", saelens)):
                start = time.perf_counter()
                sae = train(arch, data[seed], seed, fields, args)
                seconds[name] += time.perf_counter() - start
                r = evaluate_synthetic(sae, model, n_samples=n_eval, seed=EVAL_SEED, batch_size=min(n_eval, 8192))
                scores[name].append({"seed": seed, **{k: v for k, v in r.items() if k != "classification"},
                                     **r["classification"]})  # fmt: skip
        (mo, so), (mt, st) = (_stats([s["mcc"] for s in scores[k]]) for k in ("ours", "sae-lens"))
        noise = 2 * math.sqrt((so**2 + st**2) / args.seeds)
        verdict = "PASS" if mo >= mt - noise else "MISS"
        l0 = [statistics.fmean(s["sae_l0"] for s in scores[k]) for k in scores]
        dead = [statistics.fmean(s["dead_latents"] for s in scores[k]) for k in scores]
        print(f"{arch:22s} {mo:8.3f} ± {so:5.3f} {mt:8.3f} ± {st:5.3f} {l0[0]:8.2f} / {l0[1]:6.2f} "
              f"{dead[0]:8.1f} / {dead[1]:7.1f}  {verdict} (ours - sae-lens {mo - mt:+.3f}, noise {noise:.3f}; "
              f"{seconds['ours']:.1f} s / {seconds['sae-lens']:.1f} s)", flush=True)  # fmt: skip
        results[arch] = {"settings": {**fields[0], **fields[1]}, "scores": scores, "seconds": seconds,
                         "verdict": verdict}  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
