"""Attribution's memory: `estimate_memory` against the measured peak RSS, per case, lazy and eager transcoders.

    python bench/attribution_memory.py                                   # toy size (a few seconds a case)
    python bench/attribution_memory.py --model gpt2-small --tokens 8,16,64,256 --width 24576 --batch-size 16,512

The model: `toy` (4 layers, d_model 128, random, built in memory) or `gpt2-small` (the GPT-2-small-shaped
random checkpoint of `_common.checkpoint`, loaded raw). Transcoders: one TopK(k) per layer of `--width`
features without skip, drawn from one seed, written once to a temporary folder (`--format saelens` or
`circuit-tracer`) and loaded from it in each worker, lazily (`load_transcoders(lazy=True)`: the matrices
mapped, nothing read) or eagerly (`lazy=False`). The prompt: `tokens` random ids after the BOS.

Each case runs in a fresh worker process (one thread): the RSS after imports (`base`), after loading the
model and the transcoders and one warm-up `attribute` call on 2 tokens (`before`: the weights held, and
the code pages a first call touches), then one `attribute` call (check_memory=False) measured as peak RSS
over `before` (`_common.PeakMemory`, after `_common.return_freed_memory_to_os`, so
every large block is its own mapping and the peak is the call's own). Reported per case: the estimate's
weights against before - base, its work (the parts over the weights) against the measured increase, and
the ratios; and the whole peak RSS against base + the estimate's total. Run it alone: RSS on a busy machine is noisy.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

BOS = 50256


def toy_model() -> Any:
    from interp_gpt import GPT
    from interp_gpt.config import Config

    torch.manual_seed(0)
    cfg = Config(
        n_layers=4, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=50257, n_ctx=1024, act_fn="gelu_new",
        normalization_type="LN",
    )  # fmt: skip
    return GPT(cfg).eval()


def load_model(name: str) -> Any:
    from interp_gpt import GPT

    if name == "toy":
        return toy_model()
    folder, _ = C.checkpoint()
    return GPT.from_pretrained_no_processing(str(folder))


def write_transcoders(model: Any, width: int, k: int, folder: Path, fmt: str, seed: int = 0) -> None:
    from interp_gpt.sae import save_transcoders

    save_transcoders(make_transcoders(model, width, k, seed), folder, format=fmt)


def make_transcoders(model: Any, width: int, k: int, seed: int = 0) -> list[Any]:
    """One random TopK(k) transcoder per layer of `width` features, no skip, reading ln2.hook_normalized and
    writing hook_mlp_out (what this script and bench/device_attribution.py measure)."""
    from interp_gpt.sae import Transcoder, TranscoderConfig

    d = model.cfg.d_model
    tcs = []
    for layer in range(model.cfg.n_layers):
        cfg = TranscoderConfig(
            d_in=d, d_sae=width, d_out=d, architecture="topk", k=k, skip=False, nonnegative_acts=False,
            metadata={"hook_name": f"blocks.{layer}.ln2.hook_normalized", "hook_name_out": f"blocks.{layer}.hook_mlp_out"},
        )  # fmt: skip
        tc = Transcoder(cfg)
        g = torch.Generator().manual_seed(seed * 1000 + layer)
        with torch.no_grad():
            tc.W_enc.copy_(torch.randn(d, width, generator=g) / d**0.5)
            tc.W_dec.copy_(torch.randn(width, d, generator=g) / width**0.5)
            tc.b_enc.copy_(torch.randn(width, generator=g) * 0.1)
        tcs.append(tc)
    return tcs


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    from interp_gpt.attribution import attribute
    from interp_gpt.attribution.memory import estimate_memory
    from interp_gpt.sae import load_transcoders

    C.return_freed_memory_to_os()
    gc.collect()
    base = C.rss_bytes()
    model = load_model(args.model)
    tcs = load_transcoders(args.folder, lazy=args.lazy == "lazy")
    tokens = torch.cat([torch.tensor([BOS]), C.random_tokens(1, args.n_tokens, seed=0)[0]])
    attribute(model, tokens[:2], tcs, batch_size=2, check_memory=False)  # warm-up: code pages, lazy imports
    gc.collect()
    before = C.rss_bytes()
    kw = {"batch_size": args.one_batch_size, "max_feature_nodes": args.max_feature_nodes, "sparse": args.sparse}
    est = estimate_memory(model, tcs, tokens.shape[0], **kw)
    with C.PeakMemory() as mem:
        graph = attribute(model, tokens, tcs, check_memory=False, **kw)
    assert graph.active_features.shape[0] == est.n_features, (graph.active_features.shape[0], est.n_features)
    out = {
        "weights_measured": before - base,
        "weights_estimate": est.weights,
        "increase_measured": mem.increase,
        "peak_measured": mem.peak,
        "peak_estimate": base + est.total,
        "work_estimate": est.work,
        "parts": est.parts(),
        "n_features": est.n_features,
    }
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["toy", "gpt2-small"], default="toy")
    p.add_argument("--tokens", default="8,16,64", help="prompt lengths, comma-separated (the BOS not counted)")
    p.add_argument("--width", type=int, default=2048, help="features per transcoder")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--batch-size", default="16,128", help="comma-separated")
    p.add_argument("--lazy", default="lazy,eager", help="lazy, eager or both (comma-separated)")
    p.add_argument("--format", choices=["saelens", "circuit-tracer"], default="saelens")
    p.add_argument("--max-feature-nodes", type=int, default=None)
    p.add_argument("--sparse", action="store_true", help="the adjacency sparse (default dense)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--n-tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--one-batch-size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    tokens = [int(t) for t in args.tokens.split(",")]
    batches = [int(b) for b in args.batch_size.split(",")]
    modes = [m.strip() for m in args.lazy.split(",")]
    results: dict[str, Any] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "transcoders"
        write_transcoders(load_model(args.model), args.width, args.k, folder, args.format)
        head = f"{'case':<34} {'weights est/meas MiB':>22} {'work est/meas MiB':>20} {'ratio':>6} {'peak est/meas MiB':>18}"
        print(head, flush=True)
        for mode in modes:
            for batch in batches:
                for n in tokens:
                    cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--folder", str(folder)]
                    cmd += ["--n-tokens", str(n), "--one-batch-size", str(batch), "--lazy", mode]
                    cmd += ["--sparse"] if args.sparse else []
                    if args.max_feature_nodes is not None:
                        cmd += ["--max-feature-nodes", str(args.max_feature_nodes)]
                    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if done.returncode != 0:
                        raise RuntimeError(f"worker failed:\n{done.stderr[-3000:]}")
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    key = f"{mode}, {n} tokens, batch {batch}"
                    meas = row["increase_measured"] or 0
                    row["work_ratio"] = row["work_estimate"] / meas if meas else None
                    results[key] = row
                    w = f"{row['weights_estimate'] / 2**20:.0f}/{row['weights_measured'] / 2**20:.0f}"
                    r = f"{row['work_ratio']:.2f}" if row["work_ratio"] else "-"
                    pk = f"{row['peak_estimate'] / 2**20:.0f}/{row['peak_measured'] / 2**20:.0f}"
                    print(
                        f"{key:<34} {w:>22} {row['work_estimate'] / 2**20:>9.1f}/{meas / 2**20:<9.1f} {r:>6} {pk:>18}"
                    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
