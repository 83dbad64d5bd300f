"""Training sparse autoencoders: `SAETrainer`, the evaluation metrics, and the command line.

    python -m interp_gpt.sae.training --model tiny-gpt2 --hook blocks.1.hook_resid_pre \\
        --architecture topk --d-sae 1024 --k 32 --n-tokens 4000000 --out saes/resid1

The losses are sae-lens 6's (its `TrainingSAE.training_forward_pass`):
  * reconstruction: `mse = ((x_hat - x) ** 2).sum(-1).mean()` (summed over d_in, mean over rows);
  * "standard" (ReLU): `+ l1_coefficient * (f * ||W_dec[i]||).sum(-1).mean()`, its StandardTrainingSAE
    term (the L1 of the feature activations weighted by the decoder rows' norms, so rescaling a decoder
    row cannot shrink the penalty), the coefficient warmed up linearly over `l1_warm_up_steps`;
  * "topk": `+ aux_coefficient * min(n_dead / k_aux, 1) * ||(x - x_hat) - W_dec^T topk_aux(f_dead)||^2`,
    its TopKTrainingSAE's AuxK loss: the `k_aux = d_in // 2` largest pre-activations of the dead
    features reconstruct the residual the live ones leave.
A feature is dead when it has not fired on any row of the last `dead_feature_window` batches.
With `normalize_decoder` (the default for TopK) the decoder rows are kept at unit norm: the gradient's
component along each row is removed before the Adam step and the rows are renormalised after it.

Metrics (`evaluate_sae`, and the training log), with sae-lens' definitions:
  * L0: mean number of active features per token;
  * MSE: mean over tokens of the summed squared error;
  * explained variance: `1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`;
  * CE loss recovered: `(CE_zero_ablation - CE_spliced) / (CE_zero_ablation - CE_clean)`, where the
    hook's activation is replaced by zeros (zero ablation) or by the SAE's reconstruction (spliced).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_float, check_int_in_range
from .config import SAEConfig, SAEMetadata
from .core import SAE

__all__ = [
    "SAETrainingConfig",
    "SAETrainer",
    "evaluate_sae",
    "explained_variance",
    "split_corpus",
    "token_windows",
    "activation_batches",
    "SHIPPED_SAE_DIR",
    "shipped_sae",
    "main",
]

SHIPPED_SAE_DIR = Path(__file__).resolve().parent.parent / "weights" / "tiny-gpt2-sae"


def shipped_sae(device: str | torch.device = "cpu") -> SAE:
    """The TopK SAE shipped for tiny-gpt2's `blocks.1.hook_resid_pre` (its metrics: metrics.json beside it).

    Example:
        >>> sae = shipped_sae()
        >>> sae.cfg.hook_name
        'blocks.1.hook_resid_pre'
    """
    return SAE.from_pretrained(SHIPPED_SAE_DIR, device=device)


# ----------------------------------------------------------------------------
# data: the train / validation split, token windows, activation batches
# ----------------------------------------------------------------------------
def split_corpus(data_dir: str | Path = "data/corpus", val_frac: float = 0.1) -> tuple[list[str], list[str]]:
    """(train texts, validation texts): each .txt file of `data_dir` (sorted by name) read as the shipped
    model's training script reads it (byte-order mark dropped, CRLF -> LF) and cut at the first newline
    at or after `1 - val_frac` of its characters; the tail is validation. With the default 0.1 this is
    about the tail the shipped model held out for its own validation (the last 10% of each corpus's tokens).

    Example:
        >>> train, val = split_corpus("data/corpus")
        >>> len(train), len(val)
        (2, 2)
    """
    val_frac = check_float(val_frac, "val_frac", 0.0, 0.5)
    folder = Path(data_dir)
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"data_dir={str(data_dir)!r}: expected a folder holding .txt files")
    train, val = [], []
    for f in files:
        text = f.read_text(encoding="utf-8").lstrip("\ufeff").replace("\r\n", "\n")
        cut = text.find("\n", int(len(text) * (1 - val_frac)))
        cut = len(text) if cut < 0 else cut + 1
        train.append(text[:cut])
        val.append(text[cut:])
    return train, val


def token_windows(model: Any, texts: Sequence[str], context_size: int = 128, max_windows: int | None = None) -> Tensor:
    """The texts as token windows `[n, context_size]` (BOS first), cut as the activation store cuts them.

    Example:
        >>> token_windows(model, ["Some text ..."], context_size=16).shape
        torch.Size([..., 16])
    """
    from ..store.text import TokenWindows

    rows = []
    for w in TokenWindows(model.tokenizer, list(texts), context_size, prepend_bos=True):
        rows.append(w)
        if max_windows is not None and len(rows) >= max_windows:
            break
    if not rows:
        raise ValueError(f"texts: too short for one window of context_size={context_size} tokens")
    return torch.stack(rows)


def activation_batches(
    model: Any,
    hook: str,
    texts: Sequence[str],
    batch_size: int = 4096,
    context_size: int = 128,
    seed: int = 0,
    device: str | torch.device = "cpu",
    keep_in_memory: bool = True,
) -> Iterator[Tensor]:
    """Endless mixed batches `[batch_size, d_in]` of `hook`'s activations on `texts`, from the activation
    store. The first pass over the data comes from the store; with `keep_in_memory` its rows are kept
    (as float16 when the activations are float32) and later passes reshuffle them instead of running the
    model again (a fresh, reseeded store per pass otherwise).

    Example:
        >>> x = next(activation_batches(model, "blocks.1.hook_resid_pre", texts))   # [4096, 128]
    """
    from ..store import ActivationStore

    kept: list[Tensor] = []
    epoch = 0
    while True:
        if epoch and keep_in_memory:
            rows = torch.cat(kept) if len(kept) > 1 else kept[0]
            kept = [rows]
            order = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(seed + epoch))
            for i in range(0, rows.shape[0] - batch_size + 1, batch_size):
                yield rows[order[i : i + batch_size]].to(device=device, dtype=torch.float32)
        else:
            store = ActivationStore(
                model,
                hook,
                list(texts),
                context_size=context_size,
                batch_size=32,
                out_batch_size=batch_size,
                seed=seed + epoch,
                device=device,
            )
            for x in store:
                assert isinstance(x, Tensor)
                if x.shape[0] == batch_size:
                    if keep_in_memory and not epoch:
                        kept.append(x.to("cpu", torch.float16 if x.dtype == torch.float32 else x.dtype))
                    yield x
            if not kept and keep_in_memory:
                raise ValueError(f"texts: fewer than batch_size={batch_size} tokens of activations")
        epoch += 1


# ----------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------
def explained_variance(x: Tensor, x_hat: Tensor) -> float:
    """sae-lens' explained variance of rows `x` `[n, d]` by `x_hat`: 1 - SSE / total sum of squares.

    Example:
        >>> explained_variance(x, sae(x))
        0.93
    """
    x, x_hat = x.double(), x_hat.double()
    return float(1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


@torch.no_grad()
def evaluate_sae(model: Any, sae: SAE, tokens: Tensor, batch_size: int = 32) -> dict[str, float]:
    """The SAE's metrics on `tokens` `[batch, pos]` at its hook: l0, mse, explained_variance,
    dead_fraction (features that never fire on these tokens), ce_clean, ce_spliced, ce_zero_ablation,
    ce_loss_recovered (see the module's docstring for the definitions). Every position counts (BOS too,
    as sae-lens' evaluation does by default).

    Example:
        >>> evaluate_sae(model, sae, token_windows(model, val_texts))["ce_loss_recovered"]
        0.95
    """
    hook = sae.cfg.hook_name
    if not isinstance(hook, str):
        raise ValueError("sae: its cfg.metadata.hook_name is not set; the metrics need the hook it reads")
    model.hook_points([hook], arg="sae.cfg.metadata.hook_name")
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    sse = tss_sum = 0.0
    n_rows, l0_sum = 0, 0.0
    x_sum = None
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=sae.device)

    def zero(act: Tensor, hook: Any) -> Tensor:
        return torch.zeros_like(act)

    for i in range(0, tokens.shape[0], batch_size):
        t = tokens[i : i + batch_size].to(model.W_E.device)
        w = t.shape[0] / tokens.shape[0]
        loss, cache = model.run_with_cache(t, names_filter=[hook], return_type="loss")
        ce["clean"] += float(loss) * w
        x = cache[hook].reshape(-1, sae.cfg.d_in).to(sae.device, sae.dtype)
        feats = sae.encode(x)
        x_hat = sae.decode(feats)
        fired |= (feats > 0).any(0)
        l0_sum += float((feats > 0).sum())
        sse += float((x - x_hat).double().pow(2).sum())
        xd = x.double()
        x_sum = xd.sum(0) if x_sum is None else x_sum + xd.sum(0)
        tss_sum += float(xd.pow(2).sum())
        n_rows += x.shape[0]
        with model.saes([sae]):
            ce["spliced"] += float(model(t, return_type="loss")) * w
        ce["zero"] += float(model.run_with_hooks(t, return_type="loss", fwd_hooks=[(hook, zero)])) * w
    assert x_sum is not None
    tss = tss_sum - float(x_sum.pow(2).sum()) / n_rows  # sum ||x - mean||^2
    return {
        "l0": l0_sum / n_rows,
        "mse": sse / n_rows,
        "explained_variance": 1 - sse / tss,
        "dead_fraction": float((~fired).float().mean()),
        "ce_clean": ce["clean"],
        "ce_spliced": ce["spliced"],
        "ce_zero_ablation": ce["zero"],
        "ce_loss_recovered": (ce["zero"] - ce["spliced"]) / (ce["zero"] - ce["clean"]),
        "n_tokens": float(n_rows),
    }


# ----------------------------------------------------------------------------
# the trainer
# ----------------------------------------------------------------------------
@dataclass
class SAETrainingConfig:
    """How to train: the optimiser, the sparsity and dead-feature terms, and the logging.

    Example:
        >>> SAETrainingConfig(lr=4e-4, l1_coefficient=5.0)
    """

    lr: float = 4e-4
    adam_betas: tuple[float, float] = (0.9, 0.999)
    lr_warm_up_steps: int = 0  # linear warm-up from 0
    lr_decay_steps: int = 0  # linear decay to 0 over the last this many steps (0: constant)
    l1_coefficient: float = 1.0  # "standard" only
    l1_warm_up_steps: int = 0
    aux_coefficient: float = 1 / 32  # "topk" AuxK loss weight (sae-lens' default is 1.0; OpenAI's paper 1/32)
    dead_feature_window: int = 200  # batches without firing before a feature counts as dead
    normalize_decoder: bool | None = None  # None: True for topk, False for standard (its L1 is norm-weighted)
    init_weights: bool = True  # False: train from the SAE's current weights
    init_b_dec_to_mean: bool = True  # b_dec starts at the first batch's mean
    log_every: int = 100
    eval_every: int = 0  # steps between CE-recovered evaluations on eval_tokens (0: only at the end)
    seed: int = 0
    history: list[dict[str, float]] = field(default_factory=list, repr=False)


class SAETrainer:
    """Train `sae` with Adam on batches of activations `[batch, d_in]` (e.g. from `activation_batches`).

    Args:
        sae: the SAE to train in place ("standard" or "topk").
        cfg: a `SAETrainingConfig`.
        model, eval_tokens: when given, the log reports the CE loss recovered on `eval_tokens` every
            `cfg.eval_every` steps and at the end.

    Example:
        >>> sae = SAE(SAEConfig(d_in=128, d_sae=1024, architecture="topk", k=32,
        ...                     metadata={"hook_name": "blocks.1.hook_resid_pre"}))
        >>> trainer = SAETrainer(sae, SAETrainingConfig(lr=4e-4))
        >>> log = trainer.train(activation_batches(model, "blocks.1.hook_resid_pre", texts), n_steps=1000)
    """

    def __init__(
        self,
        sae: SAE,
        cfg: SAETrainingConfig | None = None,
        model: Any = None,
        eval_tokens: Tensor | None = None,
    ) -> None:
        if not isinstance(sae, SAE):
            raise TypeError(f"sae: expected an interp_gpt SAE, got {type(sae).__name__}")
        if sae.cfg.architecture not in ("standard", "topk"):
            raise ValueError(f"sae.cfg.architecture={sae.cfg.architecture!r}: the trainer trains 'standard' or 'topk'")
        if sae.cfg.normalize_activations != "none" or sae.cfg.reshape_activations != "none":
            raise ValueError("sae: train with normalize_activations='none' and reshape_activations='none'")
        if sae.cfg.architecture == "topk" and sae.cfg.rescale_acts_by_decoder_norm:
            raise ValueError("sae: train TopK with rescale_acts_by_decoder_norm=False (the decoder is kept unit-norm)")
        self.sae, self.cfg = sae, cfg or SAETrainingConfig()
        if (model is None) != (eval_tokens is None):
            raise ValueError("model and eval_tokens: pass both (for the CE loss recovered) or neither")
        self.model, self.eval_tokens = model, eval_tokens
        c = self.cfg
        check_float(c.lr, "cfg.lr", 0.0)
        check_int_in_range(c.dead_feature_window, "cfg.dead_feature_window", 1, None)
        check_int_in_range(c.log_every, "cfg.log_every", 1, None)
        self.topk = sae.cfg.architecture == "topk"
        self.normalize_decoder = self.topk if c.normalize_decoder is None else bool(c.normalize_decoder)
        self.optimizer = torch.optim.Adam(
            [sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec], lr=c.lr, betas=(c.adam_betas[0], c.adam_betas[1])
        )
        self.steps_since_fired = torch.zeros(sae.cfg.d_sae, dtype=torch.long, device=sae.device)
        self.n_steps = 0
        self.n_tokens = 0
        self._initialised = False
        self._fired: Tensor | None = None  # the features the last `losses` fired
        self.log: list[dict[str, float]] = []

    # ----- one step -----------------------------------------------------------------
    @torch.no_grad()
    def _initialise(self, x: Tensor) -> None:
        sae, gen = self.sae, torch.Generator().manual_seed(self.cfg.seed)
        w = torch.randn(sae.W_dec.shape, generator=gen, dtype=torch.float32)
        w = w / w.norm(dim=-1, keepdim=True) * (1.0 if self.normalize_decoder or self.topk else 0.1)
        sae.W_dec.copy_(w)
        sae.W_enc.copy_(w.T)  # sae-lens' init: the encoder starts as the decoder's transpose
        sae.b_enc.zero_()
        sae.b_dec.copy_(x.mean(0) if self.cfg.init_b_dec_to_mean else torch.zeros_like(sae.b_dec))
        self._initialised = True

    def losses(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss on a batch `[n, d_in]` and its parts (mse, l1 or aux) and the features.
        TopK (sae-lens' maths) folds `b_dec` into the encoder bias (`(x - b_dec) @ W_enc = x @ W_enc -
        b_dec @ W_enc`: no `[n, d_in]` input gradient) and decodes by summing the k chosen decoder rows
        per token (`embedding_bag`: k / d_sae of the dense matmul's work, forward and backward)."""
        sae = self.sae
        if self.topk:
            assert sae.cfg.k is not None
            bias = sae.b_enc - sae.b_dec @ sae.W_enc if sae.cfg.apply_b_dec_to_input else sae.b_enc
            hidden_pre = torch.addmm(bias, x, sae.W_enc)  # (x - b_dec) @ W_enc + b_enc
            values, indices = torch.topk(hidden_pre, k=sae.cfg.k, dim=-1, sorted=False)
            acts = values.relu()
            x_hat = F.embedding_bag(indices, sae.W_dec, per_sample_weights=acts, mode="sum") + sae.b_dec
            with torch.no_grad():
                feats = torch.zeros_like(hidden_pre).scatter_(-1, indices, acts)
                self._fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool, device=x.device)
                self._fired[indices[acts > 0]] = True
        else:
            sae_in = x - sae.b_dec * sae.cfg.apply_b_dec_to_input
            hidden_pre = torch.addmm(sae.b_enc, sae_in, sae.W_enc)  # sae_in @ W_enc + b_enc, one pass
            feats = torch.relu(hidden_pre)
            x_hat = torch.addmm(sae.b_dec, feats, sae.W_dec)  # feats @ W_dec + b_dec
            self._fired = None
        mse = (x_hat - x).pow(2).sum(-1).mean()
        parts = {"mse": mse, "feats": feats.detach()}
        loss = mse
        if not self.topk:
            warm = self.cfg.l1_warm_up_steps
            coeff = self.cfg.l1_coefficient * (min(1.0, (self.n_steps + 1) / warm) if warm else 1.0)
            parts["l1"] = coeff * (feats * sae.W_dec.norm(dim=1)).sum(-1).mean()
            loss = loss + parts["l1"]
        else:
            dead = self.steps_since_fired >= self.cfg.dead_feature_window
            n_dead = int(dead.sum())
            if n_dead:  # AuxK: only when some feature is dead
                k_aux = sae.cfg.d_in // 2
                scale = min(n_dead / k_aux, 1.0)
                k_aux = min(k_aux, n_dead)
                masked = torch.where(dead[None], hidden_pre, -torch.inf)
                aux_values, aux_indices = masked.topk(k_aux, dim=-1, sorted=False)
                aux_hat = F.embedding_bag(aux_indices, sae.W_dec, per_sample_weights=aux_values, mode="sum")
                residual = (x - x_hat).detach()
                parts["aux"] = self.cfg.aux_coefficient * scale * (aux_hat - residual).pow(2).sum(-1).mean()
                loss = loss + parts["aux"]
        return loss, parts

    def _lr_factor(self) -> float:
        c, s = self.cfg, self.n_steps
        f = min(1.0, (s + 1) / c.lr_warm_up_steps) if c.lr_warm_up_steps else 1.0
        if c.lr_decay_steps and self.total_steps:
            f *= min(1.0, max(0.0, (self.total_steps - s) / c.lr_decay_steps))
        return f

    def step(self, x: Tensor) -> dict[str, Tensor]:
        """One Adam step on the batch `x` `[n, d_in]`; returns the loss parts and the features."""
        sae = self.sae
        x = x.to(sae.device, sae.dtype)
        if not self._initialised and self.cfg.init_weights:
            self._initialise(x)
        for g in self.optimizer.param_groups:
            g["lr"] = self.cfg.lr * self._lr_factor()
        loss, parts = self.losses(x)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.normalize_decoder and sae.W_dec.grad is not None:
            with torch.no_grad():  # keep the step tangent to the unit sphere of each decoder row
                w_dec, grad = sae.W_dec, sae.W_dec.grad
                grad -= (grad * w_dec).sum(-1, keepdim=True) * w_dec
        self.optimizer.step()
        with torch.no_grad():
            if self.normalize_decoder:
                sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True))
            fired = self._fired if self._fired is not None else (parts["feats"] > 0).any(0)
            self.steps_since_fired += 1
            self.steps_since_fired[fired] = 0
        self.n_steps += 1
        self.n_tokens += x.shape[0]
        parts["loss"] = loss.detach()
        return parts

    @property
    def dead_fraction(self) -> float:
        """The share of features that did not fire in the last `dead_feature_window` batches."""
        return float((self.steps_since_fired >= self.cfg.dead_feature_window).float().mean())

    # ----- the loop -----------------------------------------------------------------
    def train(self, batches: Iterable[Tensor], n_steps: int, progress: bool = True) -> list[dict[str, float]]:
        """Run `n_steps` steps on `batches`; every `cfg.log_every` steps (and at the end) append
        {step, tokens, loss, mse, l0, explained_variance, dead_fraction, lr, [l1 | aux],
        [ce_loss_recovered]} to `self.log` (training-batch metrics; CE on `eval_tokens`). Returns the log.

        Example:
            >>> trainer.train(activation_batches(model, hook, texts), n_steps=2000)[-1]["l0"]
        """
        n_steps = check_int_in_range(n_steps, "n_steps", 1, None)
        self.total_steps = self.n_steps + n_steps
        bar = tqdm(total=n_steps, desc="train SAE", unit="step", disable=not progress)
        it = iter(batches)
        start = time.perf_counter()
        try:
            for _ in range(n_steps):
                x = next(it, None)
                if x is None:
                    raise ValueError(f"batches: ran out after {self.n_steps} steps (n_steps asked {n_steps} more)")
                parts = self.step(x)
                last = self.n_steps == self.total_steps
                if self.n_steps % self.cfg.log_every == 0 or last:
                    entry = self._entry(x.to(self.sae.device, self.sae.dtype), parts)
                    entry["tokens_per_s"] = self.n_tokens / max(time.perf_counter() - start, 1e-9)
                    ev = self.cfg.eval_every
                    if self.model is not None and (last or (ev and self.n_steps % ev == 0)):
                        entry.update(self.evaluate())
                    self.log.append(entry)
                    bar.set_postfix(
                        {k: f"{entry[k]:.3g}" for k in ("l0", "mse", "explained_variance", "dead_fraction")}
                    )
                bar.update(1)
        finally:
            bar.close()
        return self.log

    @torch.no_grad()
    def _entry(self, x: Tensor, parts: dict[str, Tensor]) -> dict[str, float]:
        feats = parts["feats"]
        x_hat = feats @ self.sae.W_dec + self.sae.b_dec
        entry = {
            "step": float(self.n_steps),
            "tokens": float(self.n_tokens),
            "loss": float(parts["loss"]),
            "mse": float(parts["mse"]),
            "l0": float((feats > 0).float().sum(-1).mean()),
            "explained_variance": explained_variance(x, x_hat),
            "dead_fraction": self.dead_fraction,
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        for k in ("l1", "aux"):
            if k in parts:
                entry[k] = float(parts[k])
        return entry

    def evaluate(self) -> dict[str, float]:
        """`evaluate_sae` on the trainer's eval tokens, keys prefixed 'val_'."""
        assert self.model is not None and self.eval_tokens is not None
        return {f"val_{k}": v for k, v in evaluate_sae(self.model, self.sae, self.eval_tokens).items()}


# ----------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The train-sae options (this module's command and `interp-gpt train-sae`)."""
    p.add_argument("--model", default="tiny-gpt2", help="model name, hub id, folder or weights file")
    p.add_argument("--hook", default="blocks.1.hook_resid_pre", help="the hook to train on")
    p.add_argument("--data", default="data/corpus", help="folder of .txt files (split by --val-frac)")
    p.add_argument("--val-frac", type=float, default=0.1, help="tail of each file kept for validation")
    p.add_argument("--architecture", choices=("topk", "standard"), default="topk")
    p.add_argument("--d-sae", type=int, default=1024)
    p.add_argument("--k", type=int, default=32, help="active features per token (topk)")
    p.add_argument("--l1-coefficient", type=float, default=1.0, help="(standard)")
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--lr-warm-up-steps", type=int, default=0)
    p.add_argument("--lr-decay-steps", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4096, help="rows (tokens) per step")
    p.add_argument("--context-size", type=int, default=128)
    p.add_argument("--n-tokens", type=int, default=4_000_000, help="training tokens (steps x batch size)")
    p.add_argument("--val-windows", type=int, default=0, help="validation windows for the metrics (0: all)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", required=True, help="folder for cfg.json, sae_weights.safetensors, metrics.json")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train and save one SAE from parsed arguments; returns the metrics written to metrics.json."""
    from ..files import write_atomic
    from ..loading import from_pretrained

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = from_pretrained(args.model)
    model.eval()
    train_texts, val_texts = split_corpus(args.data, args.val_frac)
    val_tokens = token_windows(model, val_texts, args.context_size, args.val_windows or None)
    d_in = int(model.cfg.d_model) if "resid" in args.hook else None
    batches = activation_batches(model, args.hook, train_texts, args.batch_size, args.context_size, args.seed)
    first = next(batches)
    d_in = d_in or int(first.shape[1])
    metadata = SAEMetadata(
        hook_name=args.hook,
        model_name=model.cfg.model_name,
        context_size=args.context_size,
        prepend_bos=True,
        dataset_path=str(args.data),
    )
    sae = SAE(
        SAEConfig(
            d_in=d_in,
            d_sae=args.d_sae,
            architecture=args.architecture,
            k=args.k if args.architecture == "topk" else None,
            metadata=metadata,
        )
    )
    cfg = SAETrainingConfig(
        lr=args.lr,
        lr_warm_up_steps=args.lr_warm_up_steps,
        lr_decay_steps=args.lr_decay_steps,
        l1_coefficient=args.l1_coefficient,
        log_every=args.log_every,
        seed=args.seed,
    )
    trainer = SAETrainer(sae, cfg, model=model, eval_tokens=val_tokens)
    n_steps = max(1, args.n_tokens // args.batch_size)

    def all_batches() -> Iterator[Tensor]:
        yield first
        yield from batches

    start = time.perf_counter()
    log = trainer.train(all_batches(), n_steps, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    sae.save_model(args.out)
    final = {k.removeprefix("val_"): v for k, v in log[-1].items() if k.startswith("val_")}
    command = "python -m interp_gpt.sae.training " + " ".join(shlex.quote(a) for a in (argv or []))
    metrics = {
        "validation": final,
        "validation_text": f"the last {args.val_frac:.0%} (cut at a newline) of each .txt file in {args.data}",
        "train": {k: log[-1][k] for k in ("l0", "mse", "explained_variance", "dead_fraction")},
        "steps": trainer.n_steps,
        "train_tokens": trainer.n_tokens,
        "train_seconds": round(seconds, 1),
        "command": command,
    }
    write_atomic(Path(args.out) / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(final, indent=2))
    return metrics


def run_command(args: argparse.Namespace) -> int:
    """`interp-gpt train-sae ...` (the same options; the command recorded is this module's equivalent)."""
    argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "train-sae" else None
    run(args, argv)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m interp_gpt.sae.training ...`; returns the exit status (2: bad input)."""
    parser = argparse.ArgumentParser(prog="python -m interp_gpt.sae.training", description=__doc__.split("\n")[0])
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        run(args, argv)
    except (OSError, ValueError, TypeError, KeyError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
