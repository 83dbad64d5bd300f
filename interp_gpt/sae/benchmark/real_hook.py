"""The benchmark on a real hook: every architecture trained on the same activation batches of one hook of
a model (default: tiny-gpt2's `blocks.1.hook_resid_pre` over the shipped corpus), then scored on held-out
tokens with the core metrics, in SAEBench's terms.

`evaluate_sae` gives L0, MSE, explained variance, dead and dense latents, the CE losses (clean, spliced,
zero-ablated) and the KL of the spliced model. `core_metrics` adds what SAEBench's core eval also reports
(its definitions, `sae_bench.evals.core`): the KL of the zero-ablated model (for `kl_div_score = (KL_ablation -
KL_sae) / KL_ablation`), the mean cosine of x and x_hat, the L1 of the latents, the input and output norms,
their ratio, the relative reconstruction bias `E||x_hat||^2 / E<x, x_hat>`, the latents' firing frequencies
and the decoder's (and encoder's) mean largest cosine with another latent. Every position counts, the BOS
too (as `evaluate_sae`; SAEBench leaves BOS out).

Example:
    >>> results = real_hook_benchmark(RealHookBench(n_tokens=100_000), {"topk": recipe("topk")}, seed=0)
    >>> results["runs"]["topk"]["explained_variance"]
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from ...checks import check_float, check_int_in_range, check_text_files
from ...utils import hook_shape
from ..common import kl_divergence, zero_ablation
from ..saes.core import SAE
from ..saes.evaluation import evaluate_sae
from ..training.data import activation_batches, split_corpus, token_windows
from .recipes import activation_scale, build, deployed, init_seed, train_together

__all__ = ["RealHookBench", "PreparedHook", "prepare_real_hook", "real_hook_benchmark", "core_metrics", "ablation_kl"]

EVAL_BATCH = 16  # windows per forward in the evaluations


@dataclass
class RealHookBench:
    """The real-hook part of the benchmark: the model, hook and corpus, the training budget, the evaluation.

    Example:
        >>> RealHookBench(hook="blocks.0.hook_mlp_out", n_tokens=2_000_000, d_sae=1024, target_l0=32)
    """

    model: str = "tiny-gpt2"  # a name, hub id, folder or weights file (`from_pretrained`)
    hook: str = "blocks.1.hook_resid_pre"
    data: tuple[str, ...] = ("data/corpus",)  # text files or folders (each split by val_frac)
    val_frac: float = 0.1
    d_sae: int = 256
    target_l0: int = 8  # the topk family's k, matching pursuit's iterations; the others' coefficients aim here
    n_tokens: int = 500_000  # training tokens: n_tokens // batch_size steps
    batch_size: int = 1024
    context_size: int = 128
    lr: float = 1e-3
    val_windows: int = 32  # held-out windows of context_size tokens for the metrics

    def __post_init__(self) -> None:
        where = "RealHookBench"
        if isinstance(self.data, str):
            self.data = (self.data,)
        self.data = tuple(self.data)
        for name, low in (("d_sae", 1), ("target_l0", 1), ("n_tokens", 1), ("batch_size", 1), ("context_size", 2),
                          ("val_windows", 1)):  # fmt: skip
            setattr(self, name, check_int_in_range(getattr(self, name), name, low, None, caller=where))
        if self.target_l0 > self.d_sae:
            raise ValueError(f"{where}: target_l0={self.target_l0} is out of range: expected 1..d_sae={self.d_sae}")
        self.lr = check_float(self.lr, "lr", 0.0, caller=where)
        self.val_frac = check_float(self.val_frac, "val_frac", 0.0, 0.5, caller=where)
        for name in ("model", "hook"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise TypeError(f"{where}: {name} must be a non-empty string, got {getattr(self, name)!r}")

    @property
    def steps(self) -> int:
        """Training steps: n_tokens // batch_size (at least 1)."""
        return max(1, self.n_tokens // self.batch_size)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON, with the steps they make."""
        return {**asdict(self), "data": list(self.data), "steps": self.steps}


@torch.no_grad()
def ablation_kl(model: Any, hook: str, tokens: Tensor) -> float:
    """Mean over positions of KL(clean || `hook` zero-ablated) next-token distributions on `tokens`."""
    total = 0.0
    for i in range(0, tokens.shape[0], EVAL_BATCH):
        t = tokens[i : i + EVAL_BATCH].to(model.W_E.device)
        clean = model(t)
        ablated = model.run_with_hooks(t, fwd_hooks=[(hook, zero_ablation)])
        total += kl_divergence(clean, ablated) * t.shape[0] / tokens.shape[0]
    return total


def _max_cosine(w: Tensor) -> float:
    """Mean over rows of the largest cosine with another row (SAEBench's average_max_*_cosine_sim)."""
    if w.shape[0] < 2:
        return 0.0
    w = torch.nn.functional.normalize(w.float(), dim=-1)
    cos = w @ w.T
    cos.fill_diagonal_(-torch.inf)
    return float(cos.max(dim=-1).values.mean())


@torch.no_grad()
def core_metrics(sae: SAE, acts: Tensor) -> dict[str, float]:
    """SAEBench's core metrics that `evaluate_sae` does not give, on activations `[n, d_in]` (see the
    module's docstring): cossim, l1, l2_norm_in, l2_norm_out, l2_ratio, relative_reconstruction_bias,
    frac_alive, freq_over_1_percent, freq_over_10_percent, average_max_decoder_cosine_sim and, for an SAE with
    an encoder, average_max_encoder_cosine_sim."""
    x = acts.to(sae.device, sae.dtype)
    feats = sae.encode(x)
    x_hat = sae.decode(feats)
    x, x_hat, feats = x.double(), x_hat.double(), feats.double()
    norm_in, norm_out = x.norm(dim=-1), x_hat.norm(dim=-1)
    density = (feats != 0).double().mean(0)
    out = {
        "cossim": float(torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).mean()),
        "l1": float(feats.abs().sum(-1).mean()),
        "l2_norm_in": float(norm_in.mean()),
        "l2_norm_out": float(norm_out.mean()),
        "l2_ratio": float((norm_out / torch.where(norm_in.abs() < 1e-4, 1.0, norm_in)).mean()),
        "relative_reconstruction_bias": float(norm_out.pow(2).mean() / (x * x_hat).sum(-1).mean()),
        "frac_alive": float((density > 0).double().mean()),
        "freq_over_1_percent": float((density > 0.01).double().mean()),
        "freq_over_10_percent": float((density > 0.1).double().mean()),
        "average_max_decoder_cosine_sim": _max_cosine(sae.W_dec),
    }
    w_enc = getattr(sae, "W_enc", None)
    if isinstance(w_enc, Tensor):
        out["average_max_encoder_cosine_sim"] = _max_cosine(w_enc.T)
    return out


def _d_in(model: Any, hook: str) -> int:
    """The width of `hook`'s rows: a hook of one vector per token (resid, attn_out, mlp_out, mlp.hook_post)."""
    try:
        model.hook_points(hook, arg="hook")
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    shape = hook_shape(model.cfg, hook)
    if shape is None or len(shape) != 1:
        raise ValueError(
            f"hook={hook!r} holds {shape or 'no vector'} per token; the benchmark trains on a hook of one vector "
            "per token (hook_resid_pre, hook_attn_out, hook_mlp_out, mlp.hook_post)"
        )
    return shape[0]


@dataclass
class PreparedHook:
    """What the real-hook part needs, checked before any training: the model, the hook's width, the
    training texts and the held-out windows."""

    model: Any
    d_in: int
    train_texts: list[str]
    val_tokens: Tensor


def prepare_real_hook(cfg: RealHookBench, model: Any = None) -> PreparedHook:
    """Read the corpus, load `cfg.model` (unless `model` is given), check the hook and the context size, and
    cut the held-out windows: every fault of the real-hook part, found before the benchmark trains anything."""
    files = check_text_files(list(cfg.data), "data")
    if model is None:
        from ...loading import from_pretrained

        model = from_pretrained(cfg.model)
    model.eval()
    d_in = _d_in(model, cfg.hook)
    check_int_in_range(cfg.context_size, "context_size", 2, model.cfg.n_ctx, f"contexts of {cfg.model}")
    train_texts, val_texts = split_corpus(files, cfg.val_frac)
    val_tokens = token_windows(model, val_texts, cfg.context_size, cfg.val_windows)
    return PreparedHook(model, d_in, train_texts, val_tokens)


def real_hook_benchmark(
    cfg: RealHookBench,
    recipes: Mapping[str, Mapping[str, Any]],
    seed: int = 0,
    bar: Any = None,
    prepared: PreparedHook | None = None,
) -> dict[str, Any]:
    """Train every architecture of `recipes` on the same activation batches of `cfg.hook` and score each on
    the held-out windows. `prepared`: `prepare_real_hook(cfg)`'s result (made here when None). Returns {"hook":
    {d_in, scale, steps, train_tokens, eval_tokens, kl_div_with_ablation}, "runs": {architecture: evaluate_sae's
    metrics and `core_metrics`' (or {"error": why})}, "saes": {architecture: the trained SAE, as deployed}}."""
    if bar is None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(disable=True)
    p = prepare_real_hook(cfg) if prepared is None else prepared
    model, d_in, val_tokens = p.model, p.d_in, p.val_tokens
    bar.set_description(f"{cfg.hook}: activations")
    batches = activation_batches(model, cfg.hook, p.train_texts, cfg.batch_size, cfg.context_size, seed,
                                 model.W_E.device, keep_in_memory=True)  # fmt: skip
    first = next(batches)
    scale = activation_scale(first)
    run = {"lr": cfg.lr, "seed": init_seed(seed), "log_every": cfg.steps}
    built = {a: build(a, r, d_in, cfg.d_sae, cfg.target_l0, scale, cfg.hook, run) for a, r in recipes.items()}
    bar.set_description(f"{cfg.hook}: training")
    errors = train_together(built, itertools.chain([first], batches), cfg.steps, bar)
    bar.set_description(f"{cfg.hook}: scoring")
    with torch.no_grad():
        _, cache = model.run_with_cache(val_tokens.to(model.W_E.device), names_filter=[cfg.hook])
        acts = cache[cfg.hook].reshape(-1, d_in)
    runs: dict[str, dict[str, Any]] = {}
    saes: dict[str, SAE] = {}
    for arch, (sae, _) in built.items():
        if arch in errors:
            runs[arch] = {"error": errors[arch]}
            continue
        saes[arch] = sae = deployed(sae)
        runs[arch] = {**evaluate_sae(model, sae, val_tokens, batch_size=EVAL_BATCH), **core_metrics(sae, acts)}
    kl_ablation = ablation_kl(model, cfg.hook, val_tokens)
    hook = {"d_in": d_in, "scale": scale, "steps": cfg.steps, "train_tokens": cfg.steps * cfg.batch_size,
            "eval_tokens": int(val_tokens.numel()), "kl_div_with_ablation": kl_ablation}  # fmt: skip
    return {"hook": hook, "runs": runs, "saes": saes}
