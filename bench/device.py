"""One command for a lent GPU (issue 27, item 6): parity on the device in fp32, bf16 and fp16,
then the benchmarks in fp32 and bf16, a goal table with PASS/MISS, results in bench/results/.

    python bench/device.py [--device cuda|cpu] [--quick] [--dtypes fp32,bf16] [--parts ...]
                           [--repeats N] [--part-timeout S] [--out bench/results]

`bash bench/device.sh` wraps it (which python, the wheels, a timeout for the whole run).
`--device cpu` (or `--quick`) runs the same parts on a 2-layer, d_model-64 model with short
prompts, so CI keeps this file working; on a GPU the model is GPT-2-small-shaped (random
weights). Parts (each under its own time limit; a failing part is reported, the rest run on):

  parity    ours vs Hugging Face on the device: fp32 every hook at interp_gpt.compare's
            tolerance; bf16 / fp16 log-probs against HF fp32 within LOGPROB_TOL (see there);
  forward   logits, ours (processed) vs HF sdpa, goal <= 0.9 x HF's time;
  cache     run_with_cache of every hook vs our plain forward, goal <= 1.1 x;
  patching  the resid_pre activation-patching sweep vs transformer-lens, goal <= 0.1 x;
  generate  greedy decoding with the KV cache vs HF, goal HF time / ours >= 1.0;
  eap       eap_scores over every edge vs one forward+backward, goal <= 2 x;
  edges     100 single-edge sets through patch_edges vs 100 separate hooked forwards, <= 1/5;
  sae       SAE training vs sae-lens (tiny-gpt2, TopK), goal ours tokens/s >= 1.5 x (fp32);
  attribution  attribution graphs (device_attribution.py): time and peak at batch 128 and 512, a
            long prompt, the memory estimate against the peak, bf16 against fp32 (no goal: no peer here).

Each part's competitors come from the other bench scripts (run.py's loaders, circuits.py's
metric and separate forwards, sae_training.py's two trainers, patching.py's checkpoint), and
each competitor's peak memory (torch's peak allocated bytes on CUDA, peak RSS on the CPU) is
read on one extra call. A peer library that is not installed turns its goal into N/A with the
reason printed; nothing else needs it. Times are medians of interleaved rounds (_common.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

PARTS = ("parity", "forward", "cache", "patching", "generate", "eap", "edges", "sae", "attribution")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Log-prob tolerance for the half-precision parity rows: max |log p_ours(dtype) - log p_HF(fp32)|
# over every position and vocabulary entry must be within TOL[dtype] AND within twice what HF
# itself loses in that dtype (plus 0.01). Why these numbers: a half-precision forward rounds every
# activation and weight to unit roundoff u (bf16 2^-8 = 3.9e-3, fp16 2^-11 = 4.9e-4), so a logit
# of size |z| carries an error of a few u|z| per layer that the residual stream adds up; the
# log-softmax passes it on unchanged. With logits of a few units and a dozen layers that is
# ~30u |z|: ~0.5 nats in bf16, ~0.06 in fp16 on the largest logits. The first bound catches a
# wrong cast (fp32 weights meeting bf16 activations, an fp16 overflow); the second says we lose
# no more than the reference does in the same dtype, whatever the checkpoint.
LOGPROB_TOL = {"bf16": 0.5, "fp16": 0.0625}
GOALS = {  # part: (what, target, test on the value)
    "forward": ("forward: ours processed / HF sdpa time", "<= 0.90", lambda v: v <= 0.9),
    "cache": ("run_with_cache all hooks / our plain forward time", "<= 1.10", lambda v: v <= 1.1),
    "patching": ("resid_pre patching sweep: ours / transformer-lens time", "<= 0.10", lambda v: v <= 0.1),
    "generate": ("greedy generation: HF time / ours (speed-up)", ">= 1.00", lambda v: v >= 1.0),
    "eap": ("EAP all edges / one forward+backward time", "<= 2.00", lambda v: v <= 2.0),
    "edges": ("N single-edge sets batched / N hooked forwards time (N=100)", "<= 0.20", lambda v: v <= 0.2),
    "sae": ("SAE training: ours / sae-lens tokens per second", ">= 1.50", lambda v: v >= 1.5),
}


def _load(name: str) -> Any:
    """Another bench script as a module (they are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Skip(Exception):
    """A part (or one dtype of it) that cannot run here; the message says why."""


class PartTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise PartTimeout in the main thread after `seconds` (0: no limit)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise PartTimeout(f"ran past its {seconds} s limit")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Shapes:
    """The model and prompt sizes: GPT-2-small-shaped on a GPU, a 2-layer toy for --quick."""

    def __init__(self, quick: bool):
        self.quick = quick
        if quick:
            self.model = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 256}
            self.forward = [(2, 32)]
            self.parity = (2, 16)
            self.patching = (1, 8)
            self.generate = (1, 8, 16)
            self.eap = (2, 8)
            self.edges = (2, 8, 20)
            self.sae_windows, self.sae_batch = 32, 1024
        else:
            self.model = {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024}
            self.forward = [(4, 128), (1, 1024)]
            self.parity = (2, 64)
            self.patching = (1, 20)
            self.generate = (1, 32, 64)
            self.eap = (8, 20)
            self.edges = (8, 20, 100)
            self.sae_windows, self.sae_batch = 512, 4096


class Device:
    def __init__(self, args: argparse.Namespace, folder: Path):
        self.args = args
        self.device: str = args.device
        self.folder = folder
        self.shapes = Shapes(args.quick)
        self.repeats: int = args.repeats or (2 if args.quick else 5)
        self.run = _load("run")
        self.run._quiet()
        self.results: dict[str, Any] = {}
        self.goals: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []

    # ----- bookkeeping -----------------------------------------------------
    def goal(self, part: str, dtype: str, value: float | None, reason: str = "", detail: str = "") -> None:
        what, target, test = GOALS[part]
        status = "N/A" if value is None else ("PASS" if test(value) else "MISS")
        self.goals.append(
            {"part": part, "dtype": dtype, "goal": what, "target": target, "value": value, "status": status,
             "reason": reason, "detail": detail}
        )  # fmt: skip
        shown = "n/a" if value is None else f"{value:.3g}"
        print(f"  goal [{dtype}] {what}: {shown} ({target}: {status}){' - ' + reason if reason else ''}")

    def check(self, what: str, ok: bool, detail: str, required: bool = True) -> None:
        self.checks.append({"check": what, "ok": ok, "detail": detail, "required": required})
        print(f"  check: {what}: {detail} -> {'ok' if ok else ('FAIL' if required else 'differs (info)')}")

    def tokens(self, batch: int, pos: int, seed: int = 0) -> torch.Tensor:
        return C.random_tokens(batch, pos, seed=seed).to(self.device)

    def ours(self, dtype: torch.dtype, processed: bool = True) -> Any:
        return self.run.load_ours(self.folder, self.device, processed=processed, dtype=dtype)

    def hf(self, dtype: torch.dtype) -> Any:
        return self.run.load_hf(self.folder, "sdpa", self.device, dtype=dtype)

    def tl(self, dtype: torch.dtype) -> Any:
        if self.run.tl_name() is None:
            raise Skip("transformer-lens is not installed (carry its wheels: bench/README.md 'On a GPU')")
        return self.run.load_tl(self.folder, self.device, dtype=dtype)

    def timed(self, fns: dict[str, Callable[[], Any]], warmup: int = 1) -> dict[str, Any]:
        """Medians of interleaved rounds, then each competitor's peak memory on one more call."""
        times = C.interleaved(fns, self.repeats, warmup, self.device)
        peaks = {}
        for name, fn in fns.items():
            with C.PeakMemory(self.device) as mem:
                out = fn()
            del out
            peaks[name] = mem.increase
        med = {k: C.median(v) for k, v in times.items()}
        for k in fns:
            print(f"    {k:<34} {C.fmt_time(med[k]):>10}  peak memory + {C.fmt_bytes(peaks[k])}")
        return {"times": times, "median": med, "peak_memory_increase": peaks}

    # ----- parts -----------------------------------------------------------
    def parity(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        from interp_gpt.compare import compare

        batch, pos = self.shapes.parity
        toks = self.tokens(batch, pos, seed=3)
        hf32 = self.hf(torch.float32)
        with torch.inference_mode():
            ref = hf32(toks, use_cache=False).logits.double().log_softmax(-1)
        if dtype == torch.float32:
            report = compare(self.ours(dtype, processed=False), hf32, toks)
            worst = max((r.max_abs for r in report.rows), default=0.0)
            self.check(
                f"parity fp32 on {self.device}: every shared hook and the logits vs HF",
                bool(report.passed),
                f"{len(report.rows)} hooks, worst |diff| {worst:.2e}, logits {report.logits_max_abs:.2e} "
                f"(atol {report.atol:g} + rtol {report.rtol:g}|ref|; logits {report.logits_atol:g})",
            )
            out = {"hooks": len(report.rows), "worst_hook_diff": worst, "logits_max_abs": report.logits_max_abs}
        else:
            with torch.inference_mode():
                hf_err = float(
                    (self.hf(dtype)(toks, use_cache=False).logits.double().log_softmax(-1) - ref).abs().max()
                )
                ours_u = self.ours(dtype, processed=False)(toks).double().log_softmax(-1)
                ours_p = self.ours(dtype, processed=True)(toks).double().log_softmax(-1)
            bound = min(LOGPROB_TOL[name], 2 * hf_err + 0.01)
            out = {"hf_err": hf_err, "tolerance": bound}
            for label, lp in (("unprocessed", ours_u), ("processed", ours_p)):
                err = float((lp - ref).abs().max())
                top1 = float((lp.argmax(-1) == ref.argmax(-1)).float().mean())
                self.check(
                    f"parity {name} on {self.device}: ours {label} log-probs vs HF fp32",
                    err <= bound,
                    f"max |diff| {err:.3g} (HF {name} itself {hf_err:.3g}; tolerance min({LOGPROB_TOL[name]}, "
                    f"2 x HF + 0.01) = {bound:.3g}); top-1 agreement {top1:.1%}",
                )
                out[label] = {"max_abs": err, "top1_agreement": top1}
        return out

    def per_shape(self, goal: str, name: str, competitors: Any, mine: str, theirs: str) -> dict[str, Any]:
        """At every forward shape, time `competitors(tokens)` (label -> function) and the ratio `mine` /
        `theirs`; the goal holds for every shape, so the worst ratio is the one reported."""
        out: dict[str, Any] = {}
        for batch, pos in self.shapes.forward:
            toks = self.tokens(batch, pos)
            print(f"  {batch}x{pos} tokens:")
            with torch.inference_mode():
                r = self.timed(competitors(toks))
            r["ratio"] = C.median(r["times"][mine]) / C.median(r["times"][theirs])
            out[f"{batch}x{pos}"] = r
        worst = max(out, key=lambda s: out[s]["ratio"])
        self.goal(goal, name, out[worst]["ratio"], detail=f"worst of {', '.join(out)}: {worst}")
        return out

    def forward(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        ours, hf = self.ours(dtype), self.hf(dtype)
        return self.per_shape(
            "forward",
            name,
            lambda t: {"HF sdpa": lambda: hf(t, use_cache=False).logits, "ours": lambda: ours(t)},
            "ours",
            "HF sdpa",
        )

    def cache(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        ours = self.ours(dtype)
        return self.per_shape(
            "cache",
            name,
            lambda t: {"ours plain": lambda: ours(t), "ours all hooks": lambda: ours.run_with_cache(t)},
            "ours all hooks",
            "ours plain",
        )

    def patching(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        import transformer_lens.patching as tl_patching
        from tqdm.auto import tqdm

        from interp_gpt import patching
        from interp_gpt.metrics import logit_diff

        tl = self.tl(dtype)
        ours = self.ours(dtype)
        tl_patching.tqdm = functools.partial(tqdm, disable=True)  # its progress bar off, as ours
        batch, pos = self.shapes.patching
        clean, corrupted = self.tokens(batch, pos, seed=1), self.tokens(batch, pos, seed=2)
        answers = torch.tensor([[int(clean[0, -1]), int(corrupted[0, -1])]], device=self.device)
        metric = functools.partial(logit_diff, answer_tokens=answers)  # the same function for both
        hooks = [f"blocks.{layer}.hook_resid_pre" for layer in range(ours.cfg.n_layers)]
        with torch.no_grad():
            _, tl_cache = tl.run_with_cache(clean, names_filter=lambda n: n in hooks)
            _, our_cache = ours.run_with_cache(clean, names_filter=hooks)
            fns = {
                "transformer-lens": lambda: tl_patching.get_act_patch_resid_pre(tl, corrupted, tl_cache, metric),
                "ours": lambda: patching.get_act_patch_resid_pre(ours, corrupted, our_cache, metric, progress=False),
            }
            a, b = fns["ours"](), fns["transformer-lens"]()
            d = float((a.float() - b.float()).abs().max())
            tol = 1e-4 if dtype == torch.float32 else 0.1
            self.check(f"patching {name}: ours vs transformer-lens", d <= tol, f"max |diff| {d:.2e} (tol {tol:g})",
                       required=dtype == torch.float32)  # fmt: skip
            r = self.timed(fns, warmup=0)  # the check ran both once
        r["ratio"] = C.median(r["times"]["ours"]) / C.median(r["times"]["transformer-lens"])
        self.goal("patching", name, r["ratio"])
        return r

    def generate(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        ours, hf = self.ours(dtype, processed=False), self.hf(dtype)
        batch, pos, new = self.shapes.generate
        toks = self.tokens(batch, pos, seed=1)
        fns = {
            "HF": lambda: hf.generate(
                toks, attention_mask=torch.ones_like(toks), do_sample=False, max_new_tokens=new, use_cache=True
            ),
            "ours": lambda: ours.generate(
                toks, max_new_tokens=new, do_sample=False, use_past_kv_cache=True, stop_at_eos=False, verbose=False
            ),
        }
        with torch.inference_mode():
            a, b = fns["ours"](), fns["HF"]()
            same = a.shape == b.shape and bool((a == b).all())
            self.check(f"generate {name}: ours greedy tokens vs HF", same, f"{new} new tokens equal: {same}",
                       required=dtype == torch.float32)  # fmt: skip
            r = self.timed(fns)
            if dtype != torch.float32:  # issue 27, item 8: a trained model's greedy tokens survive the cast
                from interp_gpt.loading import from_pretrained

                kw = {"max_new_tokens": 32, "do_sample": False, "use_past_kv_cache": True, "stop_at_eos": False}
                runs = [from_pretrained("tiny-gpt2", device=self.device, dtype=d) for d in (torch.float32, dtype)]
                prompt = runs[0].to_tokens("ROMEO:\nBut soft, what light")
                want, got = (m.generate(prompt, verbose=False, **kw) for m in runs)
                n_same = int((want == got).all(0).int().cumprod(0).sum()) - prompt.shape[1]
                self.check(f"generate {name}: tiny-gpt2 greedy tokens (KV cache) vs fp32", n_same == 32,
                           f"first {n_same} of 32 new tokens equal", required=False)  # fmt: skip
        r["ratio"] = C.median(r["times"]["HF"]) / C.median(r["times"]["ours"])  # a speed-up: higher is better
        r["tokens_per_s"] = {k: batch * new / v for k, v in r["median"].items()}
        self.goal("generate", name, r["ratio"])
        return r

    def eap(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        from interp_gpt.circuits import eap_scores

        circuits = _load("circuits")
        model = self.ours(dtype)
        batch, pos = self.shapes.eap
        clean, corrupted = self.tokens(batch, pos, seed=1), self.tokens(batch, pos, seed=2)

        def fwd_bwd() -> None:
            model.zero_grad(set_to_none=True)
            circuits.metric(model(clean)).backward()

        r = self.timed(
            {"forward+backward": fwd_bwd, "eap_scores": lambda: eap_scores(model, clean, corrupted, circuits.metric)}
        )
        model.zero_grad(set_to_none=True)
        r["ratio"] = C.median(r["times"]["eap_scores"]) / C.median(r["times"]["forward+backward"])
        self.goal("eap", name, r["ratio"])
        return r

    def edges(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        from interp_gpt.circuits import Graph, patch_edges

        circuits = _load("circuits")
        model = self.ours(dtype)
        graph = Graph.from_model(model)
        batch, pos, n = self.shapes.edges
        clean, corrupted = self.tokens(batch, pos, seed=1), self.tokens(batch, pos, seed=2)
        edges = torch.randperm(graph.n_edges, generator=torch.Generator().manual_seed(0))[:n].tolist()
        sets = [[e] for e in edges]
        fns = {
            f"{n} separate hooked forwards": lambda: circuits.separate_forwards(model, graph, clean, corrupted, edges),
            "patch_edges batched": lambda: patch_edges(model, clean, corrupted, sets, circuits.metric, progress=False),
        }
        sep, bat = (torch.tensor(f(), dtype=torch.float64, device="cpu") for f in fns.values())
        d = float((sep - bat).abs().max())
        tol = 1e-4 if dtype == torch.float32 else 0.05 * max(float(sep.abs().max()), 1.0)
        self.check(f"edges {name}: batched vs separate metric values", d <= tol, f"max |diff| {d:.2e} (tol {tol:.2g})",
                   required=dtype == torch.float32)  # fmt: skip
        r = self.timed(fns, warmup=0)  # the check ran both once
        r["ratio"] = C.median(r["times"]["patch_edges batched"]) / C.median(r["times"][f"{n} separate hooked forwards"])
        self.goal("edges", name, r["ratio"], detail=f"{n} edges, {batch}x{pos} tokens")
        return r

    def sae(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        if dtype != torch.float32:
            raise Skip("fp32 only: both trainers keep the SAE and Adam in float32")
        st = _load("sae_training")
        from interp_gpt.loading import from_pretrained
        from interp_gpt.sae.training import split_corpus

        model = from_pretrained("tiny-gpt2", device=self.device).eval()
        texts, _ = split_corpus(HERE.parent / "data" / "corpus")
        text, tokens = st.prefix_text(model, texts, self.shapes.sae_windows)
        batch = self.shapes.sae_batch
        n_tokens = tokens.numel() // batch * batch
        fns: dict[str, Callable[[], Any]] = {"ours": lambda: st.ours(model, text, n_tokens, batch, self.device)}
        reason = ""
        try:
            import datasets
            import sae_lens  # noqa: F401

            if self.shapes.quick:
                raise Skip("--quick: sae-lens' mixing buffer needs the full 512 windows")
            tl_model = self.run.load_tl("tiny-gpt2", self.device)  # type: ignore[arg-type]
            dataset = datasets.Dataset.from_dict({"tokens": tokens.tolist()})
            fns["sae-lens"] = lambda: st.saelens(tl_model, dataset, n_tokens, batch, self.device)
        except ImportError as e:
            reason = f"sae-lens or its needs not installed ({e.name}): ours timed alone"
        except Skip as e:
            reason = str(e)
        except Exception as e:  # a sae-lens / transformer-lens that does not build here
            reason = f"sae-lens could not be set up: {type(e).__name__}: {e}"
        if reason:
            print(f"  {reason}")
        r = self.timed(fns)
        r["tokens"] = n_tokens
        r["tokens_per_s"] = {k: n_tokens / v for k, v in r["median"].items()}
        r["ratio"] = r["tokens_per_s"]["ours"] / r["tokens_per_s"]["sae-lens"] if "sae-lens" in fns else None
        self.goal("sae", name, r["ratio"], reason=reason, detail=f"{n_tokens} tokens, batch {batch}")
        return r

    def attribution(self, name: str, dtype: torch.dtype) -> dict[str, Any]:
        return _load("device_attribution").attribution(self, name, dtype)  # type: ignore[no-any-return]


def environment(args: argparse.Namespace) -> dict[str, Any]:
    def version(name: str) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    if args.device.startswith("cuda"):
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or "cpu"
        with contextlib.suppress(OSError, StopIteration):
            device_name = next(
                line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
            )
    return {
        "device": args.device,
        "device_name": device_name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **{k: version(k) for k in ("transformers", "transformer-lens", "sae-lens")},
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "quick": args.quick,
        "dtypes": args.dtypes,
        "parity_dtypes": args.parity_dtypes,
        "repeats": args.repeats or (2 if args.quick else 5),
    }


def goal_table(goals: list[dict[str, Any]]) -> str:
    rows = [["goal", "dtype", "value", "target", "status", "note"]]
    for g in goals:
        shown = "n/a" if g["value"] is None else f"{g['value']:.3g}"
        rows.append([g["goal"], g["dtype"], shown, g["target"], g["status"], g["reason"] or g["detail"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


class Tee:
    """Everything printed also goes to a string, which lands in the results' .txt file."""

    def __init__(self, stream: Any):
        self.stream, self.parts = stream, []  # type: ignore[var-annotated]

    def write(self, s: str) -> int:
        self.parts.append(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="the 2-layer toy shapes (the default with --device cpu)")
    p.add_argument("--full", action="store_true", help="GPT-2-small shapes even on the CPU (slow)")
    p.add_argument("--dtypes", default="fp32,bf16", help="the benchmarks' dtypes (default fp32,bf16)")
    p.add_argument("--parity-dtypes", default="fp32,bf16,fp16", help="the parity part's dtypes")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per row (default 5; quick 2)")
    p.add_argument("--part-timeout", type=int, default=150, help="seconds per part and dtype (0: none)")
    p.add_argument("--budget", type=int, default=0, help="seconds for the whole run: later parts are skipped (0: none)")
    p.add_argument("--out", default=str(HERE / "results"), help="folder for the .json and .txt results")
    p.add_argument("--tag", default="", help="added to the result files' names")
    args = p.parse_args(argv)
    args.parts = [s for s in args.parts.split(",") if s]
    args.dtypes = [s for s in args.dtypes.split(",") if s]
    args.parity_dtypes = [s for s in args.parity_dtypes.split(",") if s]
    for flag, values, known in (
        ("--parts", args.parts, PARTS),
        ("--dtypes", args.dtypes, DTYPES),
        ("--parity-dtypes", args.parity_dtypes, DTYPES),
    ):
        bad = [v for v in values if v not in known]
        if bad:
            p.error(f"{flag}: unknown {', '.join(bad)}; expected some of {', '.join(known)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch.cuda.is_available() is False on this machine")
    args.quick = args.quick or (args.device == "cpu" and not args.full)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    tee = Tee(sys.stdout)
    started = time.perf_counter()
    env = environment(args)
    part_seconds: dict[str, float] = {}
    with contextlib.redirect_stdout(tee), tempfile.TemporaryDirectory() as tmp:  # type: ignore[type-var]
        shapes = Shapes(args.quick)
        print(
            f"bench/device.py on {args.device} ({env['device_name']}); torch {env['torch']}, cuda {env['cuda']}, "
            f"transformers {env['transformers']}, transformer-lens {env['transformer-lens']}, sae-lens {env['sae-lens']}"
        )
        print(f"model {shapes.model}, random weights; {env['repeats']} timed rounds; load {env['load_average'][0]:.2f}")
        _load("run")._quiet()  # before the checkpoint is written: no progress bar
        folder = _load("patching").build_checkpoint(Path(tmp) / "gpt2-random", **shapes.model)
        bench = Device(args, folder)
        for part in args.parts:
            names = args.parity_dtypes if part == "parity" else args.dtypes
            for name in names:
                print(f"\n== {part} [{name}] ==", flush=True)
                t0 = time.perf_counter()
                limit = args.part_timeout
                if args.budget:
                    left = int(args.budget - (t0 - started))
                    limit = min(limit, left) if limit else left
                try:
                    if args.budget and limit < 5:
                        raise Skip(f"out of time: the run's --budget of {args.budget} s is spent")
                    with time_limit(limit):
                        bench.results.setdefault(part, {})[name] = getattr(bench, part)(name, DTYPES[name])
                except Skip as e:
                    print(f"  skipped: {e}")
                    bench.results.setdefault(part, {})[name] = {"skipped": str(e)}
                    if part in GOALS:
                        bench.goal(part, name, None, reason=str(e))
                except ImportError as e:
                    reason = f"{e.name or e} is not installed"
                    print(f"  skipped: {reason}")
                    bench.results.setdefault(part, {})[name] = {"skipped": reason}
                    if part in GOALS:
                        bench.goal(part, name, None, reason=reason)
                except Exception as e:  # reported; the other parts run on
                    tail = traceback.format_exc().strip().splitlines()[-3:]
                    print(f"  ERROR: {type(e).__name__}: {e}\n    " + "\n    ".join(tail))
                    bench.results.setdefault(part, {})[name] = {"error": f"{type(e).__name__}: {e}"}
                    bench.check(f"{part} {name} ran", False, f"{type(e).__name__}: {e}")
                    if part in GOALS:
                        bench.goal(part, name, None, reason=f"error: {type(e).__name__}")
                part_seconds[f"{part}/{name}"] = round(time.perf_counter() - t0, 2)
                print(f"  ({part} {name}: {part_seconds[f'{part}/{name}']:.1f} s)")
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
        failed = [c for c in bench.checks if c["required"] and not c["ok"]]
        table = goal_table(bench.goals)
        print(f"\n== goals ({env['device_name']}) ==\n{table}")
        print(
            f"\n{len(bench.checks)} checks, {len(failed)} failed"
            + "".join(f"\n  FAIL {c['check']}: {c['detail']}" for c in failed)
        )
        total = time.perf_counter() - started
        print(f"finished in {total:.0f} s")
        slug = re.sub(r"[^a-z0-9]+", "-", env["device_name"].lower()).strip("-")[:40] or "device"
        day = env["date"][:10]
        stem = (
            Path(args.out) / f"{day}_{slug}_device{'-quick' if args.quick else ''}{'_' + args.tag if args.tag else ''}"
        )
        Path(args.out).mkdir(parents=True, exist_ok=True)
        summary = {
            "environment": env,
            "goals": bench.goals,
            "checks": bench.checks,
            "results": bench.results,
            "part_seconds": part_seconds,
            "total_seconds": total,
        }
        stem.with_suffix(".json").write_text(json.dumps(summary, indent=1, default=str))
        print(f"wrote {stem}.json and {stem}.txt")
    stem.with_suffix(".txt").write_text("".join(tee.parts))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
