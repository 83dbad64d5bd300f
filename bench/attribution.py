"""Attribution graphs: our `attribute` against circuit-tracer 0.5's, time and peak memory, in one run.

    python bench/attribution.py [--tokens 8 16] [--repeats 2] [--threads 1] [--d-sae 24576] [--k 16]
                                [--ct-python .venv-ct/bin/python] [--json out.json]
    python bench/attribution.py --long 256 [--max-feature-nodes 512]    # our peak memory on a long prompt

The model is a GPT-2-small-shaped random checkpoint (`_common.checkpoint`: 12 layers, d_model 768),
loaded raw by both (circuit-tracer reads `ln2.hook_normalized` and `hook_mlp_out` unprocessed: ours with
`GPT.from_pretrained_no_processing`, theirs as tests/test_transcoder_circuit_tracer.py builds its
`TransformerLensReplacementModel` offline from a `HookedTransformerConfig`). The transcoders are 12
per-layer TopK(k) transcoders of width d_sae without skip, drawn from one seeded generator by both
workers (the same tensors, no file of 1.8 GB to write), read from `ln2.hook_normalized`, writing
`hook_mlp_out`. The prompt is `tokens` random token ids after token 50256 (the BOS for both).

Each library runs in its own worker process (circuit-tracer in its venv: it pins transformers<=4.57.3
and huggingface_hub<1, see .ci/run) with `threads` torch threads: `repeats` timed `attribute` calls
(default arguments but `batch_size`: first each library's default, then the same for both), then one
more for memory, its peak RSS over the RSS before it (`_common.PeakMemory`, after
`_common.return_freed_memory_to_os`, which is never on where we time; the model and transcoders are
excluded: both hold the same weights). Both graphs' adjacency matrices are compared in the parent.
Ratios: our best time over theirs, our peak over theirs. Run it alone: two torch processes at once
slow each other down ~5x on a 2-core machine (the workers run one after the other).

`--long N` runs ours alone on an N-token prompt (with `--max-feature-nodes`) and reports its time and
peak memory: the scale report (circuit-tracer runs out of memory on long prompts, its issue #92).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

BOS = 50256
IN_HOOK, OUT_HOOK = "ln2.hook_normalized", "hook_mlp_out"


def transcoder_tensors(layer: int, d_model: int, d_sae: int, seed: int) -> dict[str, torch.Tensor]:
    """Layer `layer`'s transcoder weights, the same in every worker: W_enc [d_model, d_sae] (ours' layout),
    b_enc, W_dec [d_sae, d_model], b_dec."""
    g = torch.Generator().manual_seed(seed * 1000 + layer)
    return {
        "W_enc": torch.randn(d_model, d_sae, generator=g) / d_model**0.5,
        "b_enc": torch.randn(d_sae, generator=g) * 0.1,
        "W_dec": torch.randn(d_sae, d_model, generator=g) / d_sae**0.5,
        "b_dec": torch.randn(d_model, generator=g) * 0.1,
    }


def prompt(n_tokens: int, seed: int) -> torch.Tensor:
    ids = C.random_tokens(1, n_tokens, seed=seed)[0]
    return torch.cat([torch.tensor([BOS]), ids])


def ours(args: argparse.Namespace, folder: Path) -> tuple[Any, Any]:
    from interp_gpt import GPT
    from interp_gpt.attribution import attribute
    from interp_gpt.sae import Transcoder, TranscoderConfig

    model = GPT.from_pretrained_no_processing(str(folder))
    tcs = []
    for layer in range(model.cfg.n_layers):
        cfg = TranscoderConfig(
            d_in=model.cfg.d_model, d_sae=args.d_sae, d_out=model.cfg.d_model, architecture="topk", k=args.k,
            skip=False, nonnegative_acts=False,
            metadata={"hook_name": f"blocks.{layer}.{IN_HOOK}", "hook_name_out": f"blocks.{layer}.{OUT_HOOK}"},
        )  # fmt: skip
        tc = Transcoder(cfg)
        tc.load_state_dict(transcoder_tensors(layer, model.cfg.d_model, args.d_sae, args.seed), strict=True)
        tcs.append(tc)

    def run(tokens: torch.Tensor) -> Any:
        kw = {} if args.max_feature_nodes is None else {"max_feature_nodes": args.max_feature_nodes}
        if args.one_batch_size:
            kw["batch_size"] = args.one_batch_size
        return attribute(model, tokens, tcs, **kw)

    return model, run


def theirs(args: argparse.Namespace, folder: Path) -> tuple[Any, Any]:
    from circuit_tracer.attribution.attribute import attribute as ct_attribute
    from circuit_tracer.transcoder.activation_functions import TopK
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
    from transformers import GPT2LMHeadModel

    sys.path.insert(0, str(ROOT / "tests"))
    from test_transcoder_circuit_tracer import their_replacement_model

    hf = GPT2LMHeadModel.from_pretrained(str(folder))
    d, n = hf.config.n_embd, hf.config.n_layer
    cpu = torch.device("cpu")
    layers = {}
    for layer in range(n):
        t = SingleLayerTranscoder(
            d, args.d_sae, TopK(args.k), layer, skip_connection=False, device=cpu, dtype=torch.float32
        )
        w = transcoder_tensors(layer, d, args.d_sae, args.seed)
        with torch.no_grad():
            t.W_enc.copy_(w["W_enc"].T)
            t.W_dec.copy_(w["W_dec"])
            t.b_enc.copy_(w["b_enc"])
            t.b_dec.copy_(w["b_dec"])
        layers[layer] = t
    tset = TranscoderSet(layers, feature_input_hook=IN_HOOK, feature_output_hook=OUT_HOOK, scan="bench")
    model = their_replacement_model(hf, tset)
    del hf

    class Tokenizer:  # what circuit-tracer asks of a tokenizer for a token-id prompt
        all_special_ids = [BOS]
        bos_token_id = pad_token_id = eos_token_id = BOS
        vocab_size = 50257
        padding_side = "right"

        def decode(self, ids: object) -> str:
            return str(ids.tolist() if isinstance(ids, torch.Tensor) else ids)

    model.tokenizer = Tokenizer()

    def run(tokens: torch.Tensor) -> Any:
        kw = {"batch_size": args.one_batch_size} if args.one_batch_size else {}
        return ct_attribute(tokens, model, max_feature_nodes=args.max_feature_nodes, **kw)

    return model, run


def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    folder, _ = C.checkpoint()
    _, run = (ours if args.worker == "ours" else theirs)(args, folder)
    tokens = prompt(args.n_tokens, args.seed)
    times, graph = [], None
    for _ in range(args.repeats):  # timed with the allocator as users have it
        graph = None
        t0 = time.perf_counter()
        graph = run(tokens)
        times.append(time.perf_counter() - t0)
    graph = None
    C.return_freed_memory_to_os()  # then one run measured with every large block its own mapping
    with C.PeakMemory() as mem:
        graph = run(tokens)
    peak = mem.increase
    assert graph is not None
    out = {"times": times, "peak_increase": peak, "n_features": int(graph.active_features.shape[0])}
    torch.save({"adjacency": graph.adjacency_matrix.to_dense().cpu(), "active": graph.active_features.cpu()}, args.save)
    print(json.dumps(out))
    return 0


def run_worker(
    python: str, name: str, n_tokens: int, batch: int, args: argparse.Namespace, save: Path
) -> dict[str, Any]:
    cmd = [python, __file__, "--worker", name, "--n-tokens", str(n_tokens), "--save", str(save)]
    cmd += ["--one-batch-size", str(batch)]
    for opt in ("repeats", "threads", "d_sae", "k", "seed"):
        cmd += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    if args.max_feature_nodes is not None:
        cmd += ["--max-feature-nodes", str(args.max_feature_nodes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8, 16], help="prompt lengths (BOS not counted)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--d-sae", type=int, default=24576)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-size",
        type=int,
        nargs="+",
        default=[0, 16],
        help="runs at these batch sizes (0: each library's default, ours 16 on the CPU, theirs 512)",
    )
    p.add_argument("--max-feature-nodes", type=int, default=None)
    p.add_argument("--ct-python", default=str(ROOT / ".venv-ct" / "bin" / "python"))
    p.add_argument("--long", type=int, default=None, help="only ours, on a prompt this long (memory)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--worker", choices=["ours", "ct"], help=argparse.SUPPRESS)
    p.add_argument("--n-tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--one-batch-size", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    C.checkpoint()  # built once, here, before the workers read it
    results: dict[str, Any] = {"machine": C.machine() if hasattr(C, "machine") else os.uname().nodename}
    lengths = [args.long] if args.long else args.tokens
    with tempfile.TemporaryDirectory() as tmp:
        for batch in [0] if args.long else args.batch_size:
            for n in lengths:
                key = f"{n} tokens, batch_size {batch or 'default'}"
                row: dict[str, Any] = {
                    "ours": run_worker(sys.executable, "ours", n, batch, args, Path(tmp) / "ours.pt")
                }
                if not args.long:
                    if not Path(args.ct_python).exists():
                        raise SystemExit(
                            f"--ct-python {args.ct_python}: no such interpreter (build .venv-ct, see .ci/run)"
                        )
                    row["ct"] = run_worker(args.ct_python, "ct", n, batch, args, Path(tmp) / "ct.pt")
                    a, b = (torch.load(Path(tmp) / f"{w}.pt", weights_only=True) for w in ("ours", "ct"))
                    assert torch.equal(a["active"], b["active"]), "different active features"
                    scale = float(b["adjacency"].abs().max())
                    row["adjacency_max_rel_diff"] = float((a["adjacency"] - b["adjacency"]).abs().max()) / scale
                    row["time_ratio"] = min(row["ours"]["times"]) / min(row["ct"]["times"])
                    if row["ours"]["peak_increase"] and row["ct"]["peak_increase"]:
                        row["memory_ratio"] = row["ours"]["peak_increase"] / row["ct"]["peak_increase"]
                results[key] = row
                print(f"{key}: {json.dumps(row)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
