"""`SAETrainer`: Adam on batches of activations `[batch, d_in]`, with sae-lens 6's losses (its
`TrainingSAE.training_forward_pass`):
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
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checks import check_float, check_int_in_range
from .core import SAE
from .evaluation import evaluate_sae, explained_variance

__all__ = ["SAETrainingConfig", "SAETrainer"]


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
