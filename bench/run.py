"""The benchmark of issue "Fast": interp_gpt beside Hugging Face and transformer-lens, in one run.

    python bench/run.py [--quick] [--only forward,cache,generate,load,patching]
                        [--repeats N] [--threads N] [--device cpu|cuda] [--json out.json]

On the GPT-2-small shape with seeded random weights (fp32), it measures:
  forward   logits for 4 x 128 and 1 x 1024 tokens: HF GPT2LMHeadModel (sdpa, eager),
            transformer-lens (3.9 HookedTransformer or 4.x TransformerBridge, whichever is
            installed), interp_gpt processed and unprocessed; plus the matmul roofline;
  cache     run_with_cache of every hook and of one layer's hooks (time, bytes cached,
            peak memory increase), interp_gpt and transformer-lens;
  generate  greedy decoding of 64 new tokens with a KV cache (tokens/s);
  load      loading the local checkpoint, each in a fresh process (time, peak RSS);
  patching  bench/patching.py's sweeps, when that file is there.
Outputs are checked against the references before they are timed. Competitors are
timed in interleaved rounds (A B C, A B C, ...) and reported as medians with our ratio
to each peer and the issue's goals marked PASS or MISS. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402
import torch  # noqa: E402

SECTIONS = ("forward", "cache", "generate", "load", "patching")
RESULT_TAG = "BENCH_RESULT "
LOGITS_ATOL = 1e-3  # ours (unprocessed) vs HF logits, and ours vs TL log-probs


def _quiet() -> None:
    """Silence the libraries' progress bars and warnings: they are not what we time."""
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:
        pass


# ----------------------------------------------------------------------------
# Loading the competitors
# ----------------------------------------------------------------------------
def tl_name() -> str | None:
    """'TL 3.9.0 HookedTransformer' or 'TL 4.3.0 TransformerBridge', or None if not installed."""
    try:
        from importlib.metadata import version

        v = version("transformer-lens")
    except Exception:
        return None
    return f"TL {v} {'HookedTransformer' if int(v.split('.')[0]) < 4 else 'TransformerBridge'}"


def load_hf(folder: Path, attn: str, device: str, dtype: torch.dtype = torch.float32) -> Any:
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(str(folder), attn_implementation=attn, dtype=dtype)
    # No end-of-text stop: every competitor generates exactly max_new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 50256
    return model.to(device).eval()


def load_tl(folder: Path, device: str, processed: bool = True, dtype: torch.dtype = torch.float32) -> Any:
    from interp_gpt.compare import to_transformer_lens

    model = to_transformer_lens(folder, processed=processed)
    if device != "cpu":  # HookedTransformer.to prints a line even when nothing moves
        model = model.to(device)
    if dtype != torch.float32:  # processed in float32 (as transformer-lens does), then cast
        model = model.to(dtype)
    return model.eval()


def load_ours(folder: Path, device: str, processed: bool = True, dtype: torch.dtype = torch.float32) -> Any:
    from interp_gpt import from_pretrained, from_pretrained_no_processing

    load = from_pretrained if processed else from_pretrained_no_processing
    return load(folder, tokenizer=None, device=device, dtype=dtype)


class Models:
    """The competitors, loaded on first use and kept for the whole run."""

    def __init__(self, folder: Path, device: str):
        self.folder, self.device = folder, device
        self._cache: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        if key not in self._cache:
            f, d = self.folder, self.device
            self._cache[key] = {
                "hf_sdpa": lambda: load_hf(f, "sdpa", d),
                "hf_eager": lambda: load_hf(f, "eager", d),
                "tl": lambda: load_tl(f, d),
                "ours": lambda: load_ours(f, d, processed=True),
                "ours_unproc": lambda: load_ours(f, d, processed=False),
            }[key]()
        return self._cache[key]


# ----------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------
class Report:
    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.checks: list[dict[str, Any]] = []
        self.goals: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def check(self, what: str, ok: bool, detail: str, required: bool = True) -> bool:
        self.checks.append({"check": what, "ok": ok, "detail": detail, "required": required})
        mark = "ok" if ok else ("FAIL" if required else "differs (info)")
        print(f"  check: {what}: {detail} -> {mark}")
        return ok

    def goal(self, what: str, value: float | None, target: str, met: bool | None) -> str:
        status = "N/A" if met is None else ("PASS" if met else "MISS")
        shown = "n/a" if value is None else f"{value:.3g}"
        self.goals.append({"goal": what, "value": value, "target": target, "status": status})
        return f"{shown} ({target}: {status})"


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for k, r in enumerate([headers, *rows]):
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        print(indent + "  ".join(cells).rstrip())
        if k == 0:
            print(indent + "  ".join("-" * w for w in widths))


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fr(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


# ----------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace, folder: Path):
        self.args = args
        self.folder = folder
        self.device = args.device
        self.models = Models(folder, args.device)
        self.report = Report()
        self.quick = args.quick
        self.shapes = [(2, 32), (1, 128)] if args.quick else [(4, 128), (1, 1024)]
        self.repeats = args.repeats or (2 if args.quick else 5)
        self.warmup = 1
        self.tl = tl_name()
        self.layer = 6  # the "one layer" of the cache rows (GPT-2 small has 0..11)

    def tokens(self, batch: int, pos: int, seed: int = 0) -> torch.Tensor:
        return C.random_tokens(batch, pos, seed=seed).to(self.device)

    def header(self, title: str) -> None:
        print(f"\n== {title} ==")

    # ----- roofline --------------------------------------------------------
    def roofline(self) -> float:
        best, rows = C.matmul_roofline(self.device, repeats=5 if self.quick else 10)
        self.report.results["roofline"] = {"gflops": best, "shapes": rows}
        shown = ", ".join(f"{r['shape']} {r['gflops']:.1f}" for r in rows)
        print(f"matmul roofline (fp32, best of GPT-2-sized products): {best:.1f} GFLOP/s  [{shown}]")
        return best

    # ----- forward ---------------------------------------------------------
    def forward(self, peak_gflops: float) -> None:
        self.header(
            f"forward logits, no hooks (inference_mode; median of {self.repeats} after {self.warmup} warm-up, interleaved)"
        )
        m = self.models
        names = {
            "hf_sdpa": "HF GPT2LMHeadModel sdpa",
            "hf_eager": "HF GPT2LMHeadModel eager",
            "ours": "interp_gpt processed",
            "ours_unproc": "interp_gpt unprocessed",
        }
        if self.tl:
            names["tl"] = f"{self.tl} processed"
        # The roofline's largest matmul joins the rounds as one more competitor, so the
        # peak rate is also sampled under the conditions the forwards ran in.
        gen = torch.Generator().manual_seed(0)
        a, b = (
            torch.randn(512, 768, generator=gen).to(self.device),
            torch.randn(768, 50257, generator=gen).to(self.device),
        )
        mm_out = torch.empty(512, 50257, device=self.device)
        measured: dict[str, dict[str, list[float]]] = {}
        for batch, pos in self.shapes:
            shape = f"{batch}x{pos}"
            toks = self.tokens(batch, pos)
            with torch.inference_mode():
                hf_logits = m.get("hf_sdpa")(toks, use_cache=False).logits
                ours_u = m.get("ours_unproc")(toks)
                for key in ("hf_sdpa", "hf_eager"):
                    ref = hf_logits if key == "hf_sdpa" else m.get(key)(toks, use_cache=False).logits
                    d = float((ours_u - ref).abs().max())
                    self.report.check(
                        f"forward {shape}: interp_gpt unprocessed logits vs {names[key]}",
                        d <= LOGITS_ATOL,
                        f"max |diff| {d:.2e} (atol {LOGITS_ATOL:g})",
                    )
                if self.tl:
                    lp = m.get("ours")(toks).log_softmax(-1)
                    d = float((lp - m.get("tl")(toks).log_softmax(-1)).abs().max())
                    self.report.check(
                        f"forward {shape}: interp_gpt processed log-probs vs {names['tl']}",
                        d <= LOGITS_ATOL,
                        f"max |diff| {d:.2e} (atol {LOGITS_ATOL:g})",
                    )
                del hf_logits, ours_u
                fns = {
                    "hf_sdpa": lambda t=toks: m.get("hf_sdpa")(t, use_cache=False).logits,
                    "hf_eager": lambda t=toks: m.get("hf_eager")(t, use_cache=False).logits,
                    **({"tl": lambda t=toks: m.get("tl")(t)} if self.tl else {}),
                    "ours": lambda t=toks: m.get("ours")(t),
                    "ours_unproc": lambda t=toks: m.get("ours_unproc")(t),
                    "matmul": lambda: torch.matmul(a, b, out=mm_out),
                }
                measured[shape] = C.interleaved(fns, self.repeats, self.warmup, self.device)
        mm_rate = 2 * 512 * 768 * 50257 / min(t for v in measured.values() for t in v.pop("matmul")) / 1e9
        peak = max(peak_gflops, mm_rate)
        self.report.results["roofline"]["gflops_during_forward"] = mm_rate
        self.report.results["roofline"]["gflops_used"] = peak
        print(
            f"roofline used: {peak:.1f} GFLOP/s (start-up {peak_gflops:.1f}; best interleaved [512x768]@[768x50257] {mm_rate:.1f})"
        )
        out: dict[str, Any] = {}
        for (batch, pos), (shape, times) in zip(self.shapes, measured.items(), strict=True):
            med = {k: C.median(v) for k, v in times.items()}
            flops = C.forward_flops(batch, pos)
            bound = flops["total"] / (peak * 1e9)
            print(f"{shape} tokens:")
            rows = []
            for key in times:
                rp, ru = ratio(med["ours"], med[key]), ratio(med["ours_unproc"], med[key])
                goal = ""
                if key == "hf_sdpa":
                    goal = (
                        "goal <= 0.90: processed "
                        + self.report.goal(f"forward {shape}: ours processed / HF sdpa time", rp, "<= 0.90", rp <= 0.9)
                        + ", unprocessed "
                        + self.report.goal(
                            f"forward {shape}: ours unprocessed / HF sdpa time", ru, "<= 0.90", ru <= 0.9
                        )
                    )
                rows.append(
                    [
                        names[key],
                        C.fmt_time(med[key]),
                        C.fmt_time(min(times[key])),
                        f"{bound / med[key]:.0%}",
                        "-" if key.startswith("ours") else fr(rp),
                        "-" if key.startswith("ours") else fr(ru),
                        goal,
                    ]
                )
            table(["", "median", "min", "of roofline", "ours proc/peer", "ours unproc/peer", ""], rows)
            frac = bound / med["ours"]
            line = (
                f"  roofline bound: {flops['total'] / 1e9:.1f} GFLOP (linear {flops['linear'] / 1e9:.1f}, unembed "
                f"{flops['unembed'] / 1e9:.1f}, attention {flops['attention'] / 1e9:.1f}) / {peak:.1f} GFLOP/s "
                f"= {C.fmt_time(bound)}; interp_gpt processed reaches {frac:.0%} of it"
            )
            if (batch, pos) == self.shapes[0]:
                line += "; goal >= 75%: " + self.report.goal(
                    f"forward {shape}: ours processed fraction of roofline", frac, ">= 0.75", frac >= 0.75
                )
            print(line)
            out[shape] = {
                "times": times,
                "median": med,
                "flops": flops,
                "roofline_bound_s": bound,
                "ours_fraction_of_roofline": frac,
            }
        self.report.results["forward"] = out

    # ----- run_with_cache --------------------------------------------------
    def cache(self) -> None:
        self.header(
            f"run_with_cache (inference_mode; median of {self.repeats} after {self.warmup} warm-up, interleaved)"
        )
        if not self.tl:
            print("  transformer-lens is not installed: interp_gpt rows only")
        from interp_gpt.compare import ATOL, RTOL, diff_tensors

        m = self.models
        L = self.layer
        one = lambda n: n.startswith(f"blocks.{L}.")  # noqa: E731
        ours = m.get("ours")
        print(f"  HF GPT2LMHeadModel: N/A (no run_with_cache); 'one layer' = every hook of blocks.{L}")
        mem = self._cache_memory()
        out: dict[str, Any] = {}
        for batch, pos in self.shapes:
            shape = f"{batch}x{pos}"
            toks = self.tokens(batch, pos)
            print(f"{shape} tokens:")
            fns: dict[str, Any] = {
                "ours plain": lambda t=toks: ours(t),
                "ours all": lambda t=toks: ours.run_with_cache(t),
                "ours one": lambda t=toks: ours.run_with_cache(t, names_filter=one),
                "ours one, stop": lambda t=toks: ours.run_with_cache(t, names_filter=one, return_type=None),
            }
            with torch.inference_mode():
                _, c_all = ours.run_with_cache(toks)
                _, c_one = ours.run_with_cache(toks, names_filter=one)
                bytes_ = {"ours all": C.cache_bytes(c_all), "ours one": C.cache_bytes(c_one)}
                counts = {"ours all": len(c_all), "ours one": len(c_one)}
                if self.tl:
                    tl = m.get("tl")
                    _, t_all = tl.run_with_cache(toks)
                    _, t_one = tl.run_with_cache(toks, names_filter=one)
                    bytes_.update({"tl all": C.cache_bytes(t_all), "tl one": C.cache_bytes(t_one)})
                    counts.update({"tl all": len(t_all), "tl one": len(t_one)})
                    hooks = [
                        "blocks.0.hook_resid_pre",
                        f"blocks.{L}.attn.hook_pattern",
                        f"blocks.{L}.mlp.hook_post",
                        "blocks.11.hook_resid_post",
                        "ln_final.hook_normalized",
                    ]
                    worst, bad = 0.0, []
                    for h in hooks:
                        d, _, ok, _ = diff_tensors(c_all[h], t_all[h], ATOL, RTOL)
                        worst = max(worst, d)
                        if not ok:
                            bad.append(h)
                    self.report.check(
                        f"cache {shape}: {len(hooks)} hooks vs {self.tl} ({', '.join(h.split('.')[-1] for h in hooks)})",
                        not bad,
                        f"max |diff| {worst:.2e} (atol {ATOL:g} + rtol {RTOL:g} |ref|)"
                        + (f"; outside: {', '.join(bad)}" if bad else ""),
                    )
                    fns.update(
                        {
                            "tl plain": lambda t=toks, tl=tl: tl(t),
                            "tl all": lambda t=toks, tl=tl: tl.run_with_cache(t),
                            "tl one": lambda t=toks, tl=tl: tl.run_with_cache(t, names_filter=one),
                        }
                    )
                    del t_all, t_one
                del c_all, c_one
                times = C.interleaved(fns, self.repeats, self.warmup, self.device)
            med = {k: C.median(v) for k, v in times.items()}
            labels = {
                "ours plain": "interp_gpt forward, no hooks",
                "ours all": "interp_gpt all hooks",
                "ours one": f"interp_gpt blocks.{L}.*",
                "ours one, stop": f"interp_gpt blocks.{L}.*, return_type=None",
                "tl plain": f"{self.tl} forward, no hooks",
                "tl all": f"{self.tl} all hooks",
                "tl one": f"{self.tl} blocks.{L}.*",
            }
            rows = []
            for key in fns:
                peer = "tl" + key.removeprefix("ours") if key.startswith("ours") else None
                r = ratio(med[key], med.get(peer)) if peer in med else None
                b = bytes_.get(key)
                pm = mem.get(key.split()[0], {}).get(shape, {}).get(key.split(" ", 1)[1].replace(", stop", "_stop"))
                rows.append(
                    [
                        labels[key],
                        C.fmt_time(med[key]),
                        C.fmt_time(min(times[key])),
                        fr(ratio(med[key], med["ours plain" if key.startswith("ours") else "tl plain"])),
                        fr(r) if key.startswith("ours") else "-",
                        str(counts.get(key, "")),
                        f"{C.fmt_bytes(b[0])} / {C.fmt_bytes(b[1])}" if b else "",
                        C.fmt_bytes(pm) if pm is not None else "n/a",
                    ]
                )
            table(
                [
                    "",
                    "median",
                    "min",
                    "x own forward",
                    "ours/TL",
                    "hooks",
                    "bytes cached (sum / distinct)",
                    "peak mem over loaded",
                ],
                rows,
            )
            for impl, name in (("ours", "interp_gpt"), ("tl", self.tl)):
                kept = mem.get(impl + " held", {}).get(shape, {}).get("all")
                if kept is not None and kept > 64 * 2**20:
                    print(
                        f"  note: {name} holds {C.fmt_bytes(kept)} from its earlier calls when a call starts; "
                        "its peak memory over the loaded model above counts it"
                    )
            self._cache_goals(shape, med, mem)
            out[shape] = {"times": times, "median": med, "bytes": bytes_, "hooks": counts}
        out["peak_memory_over_loaded"] = mem
        self.report.results["cache"] = out

    def _cache_goals(self, shape: str, med: dict[str, float], mem: dict[str, Any]) -> None:
        g = self.report.goal
        lines = []
        if "tl all" in med:
            r = ratio(med["ours all"], med["tl all"])
            lines.append(
                "all hooks, ours/TL time: "
                + g(f"cache {shape}: all hooks, ours / {self.tl} time", r, "<= 0.60", r <= 0.6)
            )
        r = ratio(med["ours all"], med["ours plain"])
        lines.append(
            "all hooks / our forward: "
            + g(f"cache {shape}: all hooks / our plain forward time", r, "<= 1.10", r <= 1.1)
        )
        # One layer's share: caching 1 of n layers should cost about 1/n of what caching all
        # of them costs over a plain forward. We allow 1.5x that share, plus 5% of the
        # forward for timing noise.
        share = (med["ours all"] - med["ours plain"]) / 12
        extra = med["ours one"] - med["ours plain"]
        allowed = 1.5 * max(share, 0.0) + 0.05 * med["ours plain"]
        lines.append(
            f"one layer's extra time {C.fmt_time(extra)} vs its share {C.fmt_time(share)}: "
            + g(
                f"cache {shape}: one layer's extra time / (all hooks' extra / 12)",
                ratio(extra, share),
                "<= 1.5 x share + 5% of forward",
                extra <= allowed,
            )
        )
        ours_mem = mem.get("ours", {}).get(shape, {})
        if ours_mem.get("one") is not None and ours_mem.get("all") is not None and ours_mem.get("plain") is not None:
            share_m = (ours_mem["all"] - ours_mem["plain"]) / 12
            extra_m = ours_mem["one"] - ours_mem["plain"]
            lines.append(
                f"one layer's extra memory {C.fmt_bytes(extra_m)} vs its share {C.fmt_bytes(share_m)}: "
                + g(
                    f"cache {shape}: one layer's extra peak memory / (all hooks' extra / 12)",
                    ratio(extra_m, share_m),
                    "<= 1.5 x share + 16 MiB",
                    extra_m <= 1.5 * max(share_m, 0) + 16 * 2**20,
                )
            )
        tl_mem = mem.get("tl", {}).get(shape, {})
        if (
            shape == f"{self.shapes[1][0]}x{self.shapes[1][1]}"
            and ours_mem.get("all") is not None
            and tl_mem.get("all") is not None
        ):
            r = ratio(ours_mem["all"], tl_mem["all"])
            lines.append(
                "all hooks peak memory, ours/TL: "
                + g(f"cache {shape}: all hooks peak memory, ours / {self.tl}", r, "<= 1.00", r <= 1.0)
            )
        for line in lines:
            print("  goal: " + line)

    def _cache_memory(self) -> dict[str, Any]:
        """Peak memory increase of each cache call, measured in a worker process per library."""
        mem: dict[str, Any] = {}
        for impl in ["ours"] + (["tl"] if self.tl else []):
            res = self.worker({"job": "cache_mem", "impl": impl, "shapes": self.shapes, "layer": self.layer})
            mem[impl] = res.get("memory", {}) if res else {}
            mem[impl + " held"] = res.get("held", {}) if res else {}
        return mem

    # ----- generation ------------------------------------------------------
    def generate(self) -> None:
        batch, pos, new = (1, 8, 16) if self.quick else (1, 32, 64)
        self.header(
            f"greedy generation, KV cache: prompt {batch}x{pos} + {new} new tokens "
            f"(median of {self.repeats} after {self.warmup} warm-up, interleaved)"
        )
        m = self.models
        toks = self.tokens(batch, pos, seed=1)
        ours = m.get("ours")

        def ours_generate(model: Any) -> Any:
            kwargs = {"max_new_tokens": new, "do_sample": False, "use_past_kv_cache": True}
            params = inspect.signature(model.generate).parameters
            kwargs.update({k: False for k in ("stop_at_eos", "verbose") if k in params})
            return lambda: model.generate(toks, **kwargs)

        fns: dict[str, Any] = {}
        for key in ("hf_sdpa", "hf_eager"):
            hf = m.get(key)
            fns[key] = lambda hf=hf: hf.generate(
                toks, attention_mask=torch.ones_like(toks), do_sample=False, max_new_tokens=new, use_cache=True
            )
        if self.tl:
            tl = m.get("tl")
            fns["tl"] = lambda: tl.generate(
                toks, max_new_tokens=new, do_sample=False, use_past_kv_cache=True, stop_at_eos=False, verbose=False
            )
        has_ours = hasattr(ours, "generate")
        with torch.inference_mode():
            reference = fns["hf_sdpa"]()
            if has_ours:
                fns["ours"] = ours_generate(ours)
                for key, model in (("ours_unproc", m.get("ours_unproc")), ("ours", ours)):
                    got = ours_generate(model)()
                    same = got.shape == reference.shape and bool((got == reference).all())
                    n_same = (
                        int((got[:, pos:] == reference[:, pos:]).all(0).int().cumprod(0).sum())
                        if got.shape == reference.shape
                        else 0
                    )
                    self.report.check(
                        f"generate: interp_gpt {'unprocessed' if key == 'ours_unproc' else 'processed'} tokens vs HF sdpa greedy",
                        same,
                        f"first {n_same} of {new} new tokens equal",
                        required=key == "ours_unproc",
                    )
            else:
                print("  interp_gpt: GPT.generate is not there yet -> N/A")
            if self.tl:
                got = fns["tl"]()
                same = got.shape == reference.shape and bool((got == reference).all())
                n_same = (
                    int((got[:, pos:] == reference[:, pos:]).all(0).int().cumprod(0).sum())
                    if got.shape == reference.shape
                    else 0
                )
                self.report.check(
                    f"generate: {self.tl} (processed) tokens vs HF sdpa greedy",
                    same,
                    f"first {n_same} of {new} new tokens equal",
                    required=False,
                )
            times = C.interleaved(fns, self.repeats, self.warmup, self.device)
        med = {k: C.median(v) for k, v in times.items()}
        tps = {k: batch * new / v for k, v in med.items()}
        labels = {
            "hf_sdpa": "HF GPT2LMHeadModel sdpa generate",
            "hf_eager": "HF GPT2LMHeadModel eager generate",
            "tl": f"{self.tl} generate",
            "ours": "interp_gpt processed generate",
        }
        rows = []
        for key in ["hf_sdpa", "hf_eager"] + (["tl"] if self.tl else []) + ["ours"]:
            if key not in med:
                rows.append([labels[key], "N/A", "", "N/A", "", ""])
                continue
            r = ratio(tps.get("ours"), tps[key]) if key != "ours" else None
            goal = ""
            if key == "hf_sdpa":
                goal = "goal >= 1.00: " + self.report.goal(
                    "generate: ours / HF sdpa tokens/s", r, ">= 1.00", None if r is None else r >= 1.0
                )
            rows.append(
                [
                    labels[key],
                    C.fmt_time(med[key]),
                    C.fmt_time(min(times[key])),
                    f"{tps[key]:.1f}",
                    "-" if key == "ours" else fr(r),
                    goal,
                ]
            )
        table(["", "median", "min", "tokens/s (median)", "ours/peer tok/s", ""], rows)
        self.report.results["generate"] = {
            "prompt": [batch, pos],
            "new_tokens": new,
            "times": times,
            "median": med,
            "tokens_per_s": tps,
        }

    # ----- loading ---------------------------------------------------------
    def load(self) -> None:
        repeats = self.args.repeats or (1 if self.quick else 3)
        self.header(f"loading the local checkpoint (a fresh process per load; median of {repeats}, interleaved)")
        impls = {
            "hf": "HF GPT2LMHeadModel.from_pretrained (sdpa)",
            "ours": "interp_gpt from_pretrained (processed)",
            "ours_np": "interp_gpt from_pretrained_no_processing",
        }
        if self.tl:
            impls["tl"] = f"{self.tl}: to_transformer_lens (processed)"
        # Read the weights once so that every process finds them in the page cache.
        for f in self.folder.iterdir():
            f.read_bytes()
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in impls}
        for _ in range(repeats):
            for key in impls:
                res = self.worker({"job": "load", "impl": key})
                if res:
                    runs[key].append(res)
        fields = ("load_s", "peak_increase", "ready_s", "ready_peak_increase", "resident_increase", "import_s")
        med = {
            k: {f: C.median([r[f] for r in v if r.get(f) is not None]) if v else None for f in fields}
            for k, v in runs.items()
        }
        rows = []
        for key, label in impls.items():
            mk = med[key]
            if mk["load_s"] is None:
                rows.append([label, "error", "", "", "", "", ""])
                continue
            rows.append(
                [
                    label,
                    C.fmt_time(mk["load_s"]),
                    C.fmt_bytes(mk["peak_increase"]),
                    C.fmt_time(mk["ready_s"]),
                    C.fmt_bytes(mk["ready_peak_increase"]),
                    C.fmt_bytes(mk["resident_increase"]),
                    C.fmt_time(mk["import_s"]),
                ]
            )
        table(
            ["", "load", "load peak RSS +", "ready (+1 token fwd)", "ready peak RSS +", "RSS + after", "import"], rows
        )
        g = self.report.goal
        for peer in ("hf", "tl"):
            if peer not in impls or med[peer]["load_s"] is None:
                continue
            for key, what in (("ours", "processed"), ("ours_np", "no processing")):
                if med[key]["load_s"] is None:
                    continue
                r = {f: ratio(med[key][f], med[peer][f]) for f in fields}
                if peer == "hf":
                    print(
                        f"  goal: ours {what} / HF: load time "
                        + g(f"load: ours {what} / HF time", r["load_s"], "<= 1.00", r["load_s"] <= 1.0)
                        + "; load peak RSS "
                        + g(
                            f"load: ours {what} / HF peak RSS increase",
                            r["peak_increase"],
                            "<= 1.00",
                            None if r["peak_increase"] is None else r["peak_increase"] <= 1.0,
                        )
                        + "; ready time "
                        + g(f"load+first forward: ours {what} / HF time", r["ready_s"], "<= 1.00", r["ready_s"] <= 1.0)
                        + "; ready peak RSS "
                        + g(
                            f"load+first forward: ours {what} / HF peak RSS increase",
                            r["ready_peak_increase"],
                            "<= 1.00",
                            None if r["ready_peak_increase"] is None else r["ready_peak_increase"] <= 1.0,
                        )
                    )
                else:
                    print(
                        f"  ours {what} / {self.tl}: load time {fr(r['load_s'])}, load peak RSS {fr(r['peak_increase'])}, "
                        f"ready time {fr(r['ready_s'])}, ready peak RSS {fr(r['ready_peak_increase'])}"
                    )
        self.report.results["load"] = {"runs": runs, "median": med}

    # ----- patching --------------------------------------------------------
    def patching(self) -> None:
        self.header("activation patching sweeps (bench/patching.py)")
        path = HERE / "patching.py"
        if not path.exists():
            print("  bench/patching.py is not there: skipped")
            self.report.notes.append("patching: skipped (bench/patching.py absent)")
            return
        spec = importlib.util.spec_from_file_location("bench_patching", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        argv = ["--tokens", "4", "--repeats", "1", "--tl-repeats", "1"] if self.quick else []
        buf = io.StringIO()
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            with contextlib.redirect_stdout(buf):
                try:
                    rc = module.main(argv)
                except SystemExit as e:  # its flags changed: run it with its defaults
                    if not argv:
                        raise
                    print(f"(flags {argv} not accepted: {e}; running with its defaults)")
                    rc = module.main([])
        except Exception as e:  # another engineer's file, still being written: report, go on
            rc = f"{type(e).__name__}: {e}"
        text = buf.getvalue().rstrip()
        for line in text.splitlines():
            print("  " + line)
        if rc not in (0, None):
            print(f"  bench/patching.py did not finish cleanly: {rc}")
        self.report.results["patching"] = {"output": text, "returned": str(rc)}

    # ----- worker processes --------------------------------------------------
    def worker(self, job: dict[str, Any]) -> dict[str, Any] | None:
        job = {**job, "folder": str(self.folder), "device": self.device, "threads": torch.get_num_threads()}
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(job)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        for line in proc.stdout.splitlines():
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG) :])
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        print(f"  worker {job['job']}/{job['impl']} failed (exit {proc.returncode}): " + " | ".join(tail))
        return None


# ----------------------------------------------------------------------------
# Worker jobs (run in a fresh process: `run.py --worker JSON`)
# ----------------------------------------------------------------------------
def run_worker(job: dict[str, Any]) -> dict[str, Any]:
    _quiet()
    torch.set_num_threads(job["threads"])
    folder, device = Path(job["folder"]), job["device"]
    if job["job"] == "load":
        return worker_load(job["impl"], folder, device)
    if job["job"] == "cache_mem":
        return worker_cache_memory(job["impl"], folder, device, job["shapes"], job["layer"])
    raise ValueError(f"unknown worker job {job['job']!r}")


def worker_load(impl: str, folder: Path, device: str) -> dict[str, Any]:
    """Import the library, then time one load and read its peak RSS increase; then run
    one token through the model ("ready") and read them again.

    The second reading matters because Hugging Face maps the safetensors file and
    reads a weight only when it is first used: its load is cheap and its first
    forward pays the rest.
    """
    t0 = time.perf_counter()
    if impl == "hf":
        import transformers  # noqa: F401

        load = lambda: load_hf(folder, "sdpa", device)  # noqa: E731
        first = lambda m, t: m(t, use_cache=False).logits  # noqa: E731
    elif impl == "tl":
        import transformer_lens  # noqa: F401
        import transformers  # noqa: F401

        import interp_gpt.compare  # noqa: F401

        load = lambda: load_tl(folder, device)  # noqa: E731
        first = lambda m, t: m(t)  # noqa: E731
    else:
        import interp_gpt  # noqa: F401

        load = lambda: load_ours(folder, device, processed=impl == "ours")  # noqa: E731
        first = lambda m, t: m(t)  # noqa: E731
    import_s = time.perf_counter() - t0
    import gc

    gc.collect()
    base = C.rss_bytes()
    ok = C.reset_peak_rss()
    t0 = time.perf_counter()
    model = load()
    C.synchronize(device)
    load_s = time.perf_counter() - t0
    peak_load = C.peak_rss_bytes()
    with torch.inference_mode():
        first(model, torch.tensor([[464]], device=device))
    C.synchronize(device)
    ready_s = time.perf_counter() - t0
    peak_ready = C.peak_rss_bytes()
    resident = C.rss_bytes() - base
    return {
        "load_s": load_s,
        "ready_s": ready_s,
        "import_s": import_s,
        "peak_increase": peak_load - base if ok else None,
        "ready_peak_increase": peak_ready - base if ok else None,
        "resident_increase": resident,
        "peak": peak_ready,
    }


def worker_cache_memory(impl: str, folder: Path, device: str, shapes: list[list[int]], layer: int) -> dict[str, Any]:
    """Peak memory of a plain forward, an all-hooks cache and a one-layer cache.

    Each figure is the call's peak over the memory of the loaded model after a 1-token
    forward (which pages in every weight but leaves next to nothing behind). Measured
    from there rather than from the memory in use just before the call, so that what a
    library keeps between calls (transformer-lens 4.x's bridge holds on to the last
    forward's attention patterns, 576 MiB on 1x1024) counts against it; how much that
    is goes in "held". glibc is told to return large freed blocks at once, so a freed
    block never hides a call's own need.
    """
    C.return_freed_memory_to_os()
    model = load_tl(folder, device) if impl == "tl" else load_ours(folder, device)
    one = lambda n: n.startswith(f"blocks.{layer}.")  # noqa: E731
    out: dict[str, Any] = {}
    held: dict[str, Any] = {}
    with torch.inference_mode():
        model(C.random_tokens(1, 1).to(device))
        loaded = C.memory_in_use(device)
        for batch, pos in shapes:
            toks = C.random_tokens(batch, pos).to(device)
            calls = {
                "plain": lambda t=toks: model(t),
                "all": lambda t=toks: model.run_with_cache(t),
                "one": lambda t=toks: model.run_with_cache(t, names_filter=one),
            }
            if impl == "ours":
                calls["one_stop"] = lambda t=toks: model.run_with_cache(t, names_filter=one, return_type=None)
            model(toks)  # warm-up: first-call allocations are not the call's own
            res, kept = {}, {}
            for name, call in calls.items():
                with C.PeakMemory(device) as mem:
                    result = call()
                del result
                res[name] = mem.peak - loaded if mem.increase is not None else None
                kept[name] = mem.entry - loaded
            out[f"{batch}x{pos}"] = res
            held[f"{batch}x{pos}"] = kept
    return {"memory": out, "held": held}


# ----------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------
def environment(args: argparse.Namespace, folder: Path, how: str) -> dict[str, Any]:
    import transformers

    cpu = platform.processor() or "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "transformer_lens": tl_name() or "not installed",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "checkpoint": str(folder),
        "checkpoint_from": how,
    }
    print(
        f"interp_gpt benchmark{' (--quick)' if args.quick else ''}: GPT-2-small shape, random weights, fp32 on "
        f"{args.device} ({env['device_name']})"
    )
    print(
        f"python {env['python']}, torch {env['torch']} ({env['threads']} threads, {env['cpus']} CPUs), "
        f"transformers {env['transformers']}, transformer-lens: {env['transformer_lens']}"
    )
    la = env["load_average"]
    print(f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}; checkpoint {folder} ({how})")
    if args.device == "cpu" and env["threads"] > 1 and la[0] > 0.5 * (env["cpus"] or 1):
        print(
            f"note: the machine is busy (load {la[0]:.1f} on {env['cpus']} CPUs); {env['threads']} torch threads then "
            "wait on each other and single runs can take several times their median: --threads 1 is steadier"
        )
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="See bench/README.md for what each row means."
    )
    p.add_argument(
        "--quick", action="store_true", help="smaller shapes, fewer repeats: a smoke test of a couple of minutes"
    )
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections (default: all): {','.join(SECTIONS)}"
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="timed repeats per row (default 5; --quick 2; loading 3 / 1)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    p.add_argument("--checkpoint", default=None, help="folder for the random GPT-2-small checkpoint (built once)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write every measurement to this file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        p.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.only = only
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch.cuda.is_available() is False on this machine")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(RESULT_TAG + json.dumps(run_worker(json.loads(args.worker))))
        return 0
    _quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    folder, how = C.checkpoint(args.checkpoint)
    env = environment(args, folder, how)
    bench = Bench(args, folder)
    peak = bench.roofline()
    for section in SECTIONS:
        if section in args.only:
            t0 = time.perf_counter()
            getattr(bench, section)(peak) if section == "forward" else getattr(bench, section)()
            print(f"  ({section}: {time.perf_counter() - t0:.0f} s)")
    rep = bench.report
    print("\n== goals ==")
    for g in rep.goals:
        shown = "n/a" if g["value"] is None else f"{g['value']:.3g}"
        print(f"  {g['status']:<4}  {g['goal']}: {shown} (goal {g['target']})")
    failed = [c for c in rep.checks if c["required"] and not c["ok"]]
    print(
        f"\n{len(rep.checks)} output checks, {len(failed)} failed"
        + ("".join(f"\n  FAIL {c['check']}: {c['detail']}" for c in failed))
    )
    la = os.getloadavg()
    print(f"finished in {time.perf_counter() - started:.0f} s; load average now {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "environment": env,
                    "results": rep.results,
                    "goals": rep.goals,
                    "checks": rep.checks,
                    "notes": rep.notes,
                },
                indent=1,
                default=str,
            )
        )
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
