"""`SAETrainer`: Adam on batches of activations `[batch, d_in]`, with sae-lens 6's losses (its
`TrainingSAE.training_forward_pass`): the reconstruction `mse = ((x_hat - x) ** 2).sum(-1).mean()`
(summed over d_in, mean over rows) plus the architecture's own terms, each written in its module
under `interp_gpt.sae.saes.architectures` (standard: the decoder-norm-weighted L1; topk: AuxK; ...).
The trainer holds what they share: Adam, the learning-rate and coefficient schedules, the optional
gradient-norm clip, the dead-feature accounting and the NaN rules.
A feature is dead when it has not fired on any row of the last `dead_feature_window` batches.
With `normalize_decoder` (the default for TopK) the decoder rows are kept at unit norm: the gradient's
component along each row is removed before the Adam step and the rows are renormalised after it.
`clip_grad_norm` (None: off, our default) clips the gradients' total norm before the step, as
sae-lens' trainer always does at 1.0.

Nothing NaN: each step checks its batch (`[batch, d_in]` floats) and that its loss is finite before the
weights change. A NaN / inf batch is refused naming the step and the first bad value (the weights stay
as they were); a non-finite loss on a finite batch (a diverged run) rolls the SAE back to its last good
state, copied every `log_every` steps (`keep_last_good`); either raises `NonFiniteTrainingError` (a
ValueError) naming the step and the step the SAE's weights now come from. Batches are never skipped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ...checks import check_float, check_int_in_range, check_tokens
from ..saes.core import SAE
from ..saes.evaluation import evaluate_sae, explained_variance

__all__ = ["SAETrainingConfig", "SAETrainer", "NonFiniteTrainingError"]


class NonFiniteTrainingError(ValueError):
    """A training step met a NaN / inf batch or loss and stopped before it changed the weights.

    `step` is the step refused (1 for the first); `last_good_step` the step the SAE's weights are from
    now (its state after that step: kept, or rolled back to), None where no finite state was there to keep.
    """

    def __init__(self, message: str, step: int, last_good_step: int | None) -> None:
        super().__init__(message)
        self.step, self.last_good_step = step, last_good_step


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
    clip_grad_norm: float | None = None  # clip the gradients' total norm to this before each step (sae-lens: 1.0)
    # The architectures' own terms, with sae-lens' names and defaults (each read only by its architecture):
    l0_coefficient: float = 1.0  # jumprelu: weight of the L0 (step / tanh / quadratic) sparsity loss
    l0_warm_up_steps: int = 0  # jumprelu
    jumprelu_init_threshold: float = 0.01  # jumprelu
    jumprelu_bandwidth: float = 0.05  # jumprelu: the straight-through estimator's kernel width
    jumprelu_sparsity_loss_mode: str = "step"  # jumprelu: "step", "tanh" or "quadratic"
    jumprelu_tanh_scale: float = 4.0  # jumprelu, "tanh" mode
    jumprelu_ste_to_input: bool = False  # jumprelu: the estimator's gradient reaches the pre-activations too
    pre_act_loss_coefficient: float | None = None  # jumprelu: Anthropic's pre-activation loss on dead features
    target_l0: float | None = None  # jumprelu, "quadratic" mode
    topk_threshold_lr: float = 0.01  # batchtopk: the running threshold's update rate
    use_matryoshka_aux_loss: bool = False  # matryoshka_batchtopk: an AuxK loss per nested width
    dead_feature_window: int = 200  # batches without firing before a feature counts as dead
    normalize_decoder: bool | None = None  # None: True for topk, False for standard (its L1 is norm-weighted)
    init_weights: bool = True  # False: train from the SAE's current weights
    init_b_dec_to_mean: bool = True  # b_dec starts at the first batch's mean
    log_every: int = 100
    eval_every: int = 0  # steps between CE-recovered evaluations on eval_tokens (0: only at the end)
    seed: int = 0
    keep_last_good: bool = True  # keep a copy of the weights every log_every steps to roll back to on NaN
    history: list[dict[str, float]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field by name (run at construction, and again by `SAETrainer`, so a field changed
        in between is checked too): a negative warm-up would climb the loss, a negative decay or interval
        would silently train at learning rate 0 or never log."""
        where = type(self).__name__
        self.lr = check_float(self.lr, "lr", 0.0, caller=where)
        betas = self.adam_betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"{where}: adam_betas must be a pair of numbers (beta1, beta2), got {betas!r}")
        self.adam_betas = (
            _check_fraction(betas[0], "adam_betas[0]", where),
            _check_fraction(betas[1], "adam_betas[1]", where),
        )
        for name, low in self._int_fields().items():
            setattr(self, name, check_int_in_range(getattr(self, name), name, low, None, caller=where))
        self.seed = check_int_in_range(self.seed, "seed", 0, 2**63 - 1, caller=where)
        for name in ("l1_coefficient", "aux_coefficient", "l0_coefficient", "jumprelu_init_threshold",
                     "jumprelu_tanh_scale", "topk_threshold_lr"):  # fmt: skip
            setattr(self, name, check_non_negative(getattr(self, name), name, where))
        for name in ("pre_act_loss_coefficient", "target_l0"):
            if getattr(self, name) is not None:
                setattr(self, name, check_non_negative(getattr(self, name), name, where))
        self.jumprelu_bandwidth = check_float(self.jumprelu_bandwidth, "jumprelu_bandwidth", 0.0, caller=where)
        if self.jumprelu_sparsity_loss_mode not in ("step", "tanh", "quadratic"):
            raise ValueError(
                f"{where}: jumprelu_sparsity_loss_mode={self.jumprelu_sparsity_loss_mode!r}; expected 'step', "
                "'tanh' or 'quadratic'"
            )
        if self.clip_grad_norm is not None:
            self.clip_grad_norm = check_non_negative(self.clip_grad_norm, "clip_grad_norm", where)
            if self.clip_grad_norm == 0:
                raise ValueError(f"{where}: clip_grad_norm=0 would zero every step; use None for no clipping")
        for name in ("normalize_decoder", "init_weights", "init_b_dec_to_mean", "keep_last_good",
                     "jumprelu_ste_to_input", "use_matryoshka_aux_loss"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "normalize_decoder" and value is None):
                none = " or None (the architecture's default)" if name == "normalize_decoder" else ""
                raise TypeError(f"{where}: {name} must be True or False{none}, got {type(value).__name__} ({value!r})")
        if not isinstance(self.history, list):
            raise TypeError(f"{where}: history must be a list, got {type(self.history).__name__}")

    def _int_fields(self) -> dict[str, int]:
        """The int fields and their least value (a subclass's config adds its own)."""
        return INT_FIELDS


# The int fields and their least value (steps and intervals; 0 where 0 means "off").
INT_FIELDS = {
    "lr_warm_up_steps": 0,
    "lr_decay_steps": 0,
    "l1_warm_up_steps": 0,
    "l0_warm_up_steps": 0,
    "dead_feature_window": 1,
    "log_every": 1,
    "eval_every": 0,
}


def check_non_negative(value: Any, arg: str, where: str = "SAETrainingConfig") -> float:
    """A finite number >= 0 (a coefficient: 0 turns its term off)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: {arg} must be a number, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {arg}={value!r} is out of range: expected a finite number >= 0")
    return float(value)


def _check_fraction(value: Any, arg: str, where: str = "SAETrainingConfig") -> float:
    """An Adam beta: a number in [0, 1)."""
    value = check_non_negative(value, arg, where)
    if value >= 1:
        raise ValueError(f"{where}: {arg}={value!r} is out of range: expected a number >= 0 and < 1")
    return value


class SAETrainer:
    """Train `sae` with Adam on batches of activations `[batch, d_in]` (e.g. from `activation_batches`).

    Args:
        sae: the SAE to train in place (standard, topk, batchtopk, matryoshka_batchtopk).
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
        self.architecture = sae.arch  # its losses and the steps around the update
        if sae.cfg.normalize_activations != "none":
            raise ValueError(
                f"sae.cfg.normalize_activations={sae.cfg.normalize_activations!r}: train with "
                "normalize_activations='none'"
            )
        # reshape_activations="hook_z" only changes how the SAE reads a [..., n_heads, d_head] activation
        # spliced into the model; the trainer sees the same rows flattened, [batch, n_heads * d_head].
        if cfg is not None and not isinstance(cfg, SAETrainingConfig):
            raise TypeError(f"cfg: expected a SAETrainingConfig, got {type(cfg).__name__}")
        self.sae, self.cfg = sae, cfg or SAETrainingConfig()
        self.cfg.validate()  # again: a field may have been changed since the config was built
        sae.arch.check_trainable(sae, self)  # (it reads self.cfg)
        if (model is None) != (eval_tokens is None):
            raise ValueError("model and eval_tokens: pass both (for the CE loss recovered) or neither")
        if model is not None and eval_tokens is not None:  # what the evaluations need, checked before step 1
            eval_tokens = check_tokens(
                eval_tokens, model.cfg.d_vocab, model.cfg.n_ctx, "eval_tokens", caller="SAETrainer"
            )
            evaluate_sae(model, sae, eval_tokens[:1])
        self.model, self.eval_tokens = model, eval_tokens
        # (the name the transcoder trainer shares): unit-norm decoder by default
        self.topk = sae.arch.unit_norm_decoder_default(sae.cfg)
        self._start(list(sae.parameters()), (sae.cfg.d_sae,), sae.device)  # the architecture's tensors, all

    _name, _what, _holds = "SAETrainer", "SAE", "holds its"  # how messages name the trainer and what it trains

    def _start(self, params: list[Tensor], n_features: tuple[int, ...], device: torch.device) -> None:
        """The optimiser and the counters (after `self.cfg` and `self.topk` are set)."""
        c = self.cfg
        self.normalize_decoder = self.topk if c.normalize_decoder is None else bool(c.normalize_decoder)
        self.optimizer = torch.optim.Adam(params, lr=c.lr, betas=(c.adam_betas[0], c.adam_betas[1]))
        self.steps_since_fired = torch.zeros(n_features, dtype=torch.long, device=device)
        self.n_steps = 0
        self.n_tokens = 0
        self._initialised = False
        self._fired: Tensor | None = None  # the features the last `losses` fired
        self.log: list[dict[str, float]] = []
        self.last_good: dict[str, Any] | None = None  # see `_keep_last_good`

    # ----- one step -----------------------------------------------------------------
    def _initialise(self, x: Tensor) -> None:
        self.architecture.init_weights(self, x)
        self._initialised = True

    @torch.no_grad()
    def default_init(self, x: Tensor) -> None:
        """sae-lens' training initialisation: random unit decoder rows (norm 0.1, sae-lens' decoder_init_norm,
        for a free decoder), the encoder their transpose, b_dec the first batch's mean (or 0), every other
        tensor 0 (b_enc; a gated SAE's b_gate, b_mag, r_mag; an architecture sets its own after this)."""
        sae, gen = self.sae, torch.Generator().manual_seed(self.cfg.seed)
        w = torch.randn(sae.W_dec.shape, generator=gen, dtype=torch.float32)
        w = w / w.norm(dim=-1, keepdim=True) * (1.0 if self.normalize_decoder or self.topk else 0.1)
        sae.W_dec.copy_(w)
        sae.W_enc.copy_(w.T)  # sae-lens' init: the encoder starts as the decoder's transpose
        for name, p in sae.named_parameters():
            if name not in ("W_enc", "W_dec", "b_dec"):
                p.zero_()
        sae.b_dec.copy_(x.mean(0) if self.cfg.init_b_dec_to_mean else torch.zeros_like(sae.b_dec))

    def coefficient(self, value: float, warm_up_steps: int) -> float:
        """`value` warmed up linearly from 0 over `warm_up_steps` steps (this step's share)."""
        return value * (min(1.0, (self.n_steps + 1) / warm_up_steps) if warm_up_steps else 1.0)

    def dead_mask(self) -> Tensor:
        """The features dead now (bool `[d_sae]`): not fired in the last `dead_feature_window` batches."""
        return self.steps_since_fired >= self.cfg.dead_feature_window

    def losses(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The training loss on a batch `[n, d_in]` and its parts (mse, the architecture's terms, the
        features): the architecture's `losses` (interp_gpt.sae.saes.architectures)."""
        loss, parts = self.architecture.losses(self, x)
        self._fired = parts.pop("fired", None)
        return loss, parts

    def _lr_factor(self) -> float:
        c, s = self.cfg, self.n_steps
        f = min(1.0, (s + 1) / c.lr_warm_up_steps) if c.lr_warm_up_steps else 1.0
        if c.lr_decay_steps and self.total_steps:
            f *= min(1.0, max(0.0, (self.total_steps - s) / c.lr_decay_steps))
        return f

    def step(self, x: Tensor) -> dict[str, Tensor]:
        """One Adam step on the batch `x` `[n, d_in]`; returns the loss parts and the features.

        Refused before the weights change: a batch of another shape (ValueError), and a batch holding
        NaN / inf or a loss that is not finite (`NonFiniteTrainingError`, naming the step). On a diverged
        loss the SAE is rolled back to its last good state (see `cfg.keep_last_good`)."""
        step = self.n_steps + 1
        x = self._check_batch(x, step)
        if not self._initialised and self.cfg.init_weights:
            if self._first_bad(x) is not None:  # the initial b_dec is this batch's mean
                self._refuse(x, step, None)
            self._initialise(x)
        for g in self.optimizer.param_groups:
            g["lr"] = self.cfg.lr * self._lr_factor()
        loss, parts = self.losses(x)
        # One sync a step (TopK's dead count and the fired-feature update sync each step already). Any NaN
        # or inf in the batch or the weights reaches the loss, so a finite loss lets the step go on.
        if not bool(torch.isfinite(loss)):
            self._refuse(x, step, loss)
        if self.cfg.keep_last_good and self.n_steps % self.cfg.log_every == 0:
            self._keep_last_good()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        decoders = self._decoders()
        with torch.no_grad():
            if self.normalize_decoder:  # keep the step tangent to the unit sphere of each decoder row
                for w_dec in decoders:
                    if w_dec.grad is not None:
                        w, grad = w_dec.flatten(1), w_dec.grad.view(w_dec.shape[0], -1)
                        grad -= (grad * w).sum(-1, keepdim=True) * w
            self._before_update(parts)
            if self.cfg.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], self.cfg.clip_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            if self.normalize_decoder:
                for w_dec in decoders:
                    w_dec.div_(w_dec.flatten(1).norm(dim=-1).view(-1, *[1] * (w_dec.ndim - 1)))
            self._after_step()
            self._after_update(parts)
            fired = self._fired if self._fired is not None else (parts["feats"] != 0).any(-2)
            self.steps_since_fired += 1
            self.steps_since_fired[fired] = 0
        self.n_steps += 1
        self.n_tokens += self._n_rows(x)
        parts["loss"] = loss.detach()
        return parts

    # ----- what a trainer of another module (transcoder_trainer) overrides --------------------
    def _decoders(self) -> list[Tensor]:
        """The decoder weights whose rows (feature i: `w[i]`, flattened) are kept unit-norm."""
        return [self.sae.W_dec]

    def _after_step(self) -> None:
        """Anything to project after the Adam step (nothing for an SAE)."""

    def _before_update(self, parts: dict[str, Tensor]) -> None:
        """The architecture's work between backward and the optimiser step."""
        self.architecture.before_step(self)

    def _after_update(self, parts: dict[str, Tensor]) -> None:
        """The architecture's work after the optimiser step (e.g. a running threshold)."""
        self.architecture.after_step(self, parts)

    def _n_rows(self, x: Any) -> int:
        return int(x.shape[0])

    def _first_bad(self, x: Any) -> tuple[str, int, int] | None:
        """(where its first NaN / inf is, how many, of how many values) in a checked batch, or None."""
        bad = ~torch.isfinite(x)
        if not bool(bad.any()):
            return None
        row, col = bad.nonzero()[0].tolist()
        return f"{x[row, col].item()} at [row {row}, column {col}]", int(bad.sum()), x.numel()

    @property
    def dead_fraction(self) -> float:
        """The share of features that did not fire in the last `dead_feature_window` batches."""
        return float((self.steps_since_fired >= self.cfg.dead_feature_window).float().mean())

    # ----- refusing bad batches and keeping the last good state ----------------------------
    def _check_batch(self, x: Any, step: int) -> Tensor:
        d_in = self.sae.cfg.d_in
        want = f"expected [batch, d_in={d_in}] (rows of activations)"
        if not isinstance(x, Tensor):
            raise TypeError(f"SAETrainer: the batch of step {step} must be a tensor, {want}; got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"SAETrainer: the batch of step {step} has dtype {x.dtype}, {want} of floats")
        if x.ndim != 2 or x.shape[1] != d_in or x.shape[0] == 0:
            flat = f"; flatten [batch, pos, d_in] with x.reshape(-1, {d_in})" if x.ndim > 2 else ""
            raise ValueError(f"SAETrainer: the batch of step {step} has shape {tuple(x.shape)}, {want}{flat}")
        return x.to(self.sae.device, self.sae.dtype)

    @torch.no_grad()
    def _weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.optimizer.param_groups[0]["params"])

    @torch.no_grad()
    def _keep_last_good(self) -> None:
        """Copy the weights (verified by this step's finite loss) and the counters: the state to roll back to."""
        if not self._weights_finite():
            return
        params = self.optimizer.param_groups[0]["params"]
        if self.last_good is None:
            self.last_good = {"params": [p.detach().clone() for p in params]}
        else:
            for kept, p in zip(self.last_good["params"], params, strict=True):
                kept.copy_(p)
        self.last_good.update(step=self.n_steps, tokens=self.n_tokens, steps_since_fired=self.steps_since_fired.clone())

    @torch.no_grad()
    def _roll_back(self) -> int | None:
        """Put the last good state back (Adam's moments start again from zero); returns its step (0 for
        untouched initial weights), or None where no good state was kept."""
        if self.last_good is None:
            return 0 if self.n_steps == 0 and self._weights_finite() else None
        for kept, p in zip(self.last_good["params"], self.optimizer.param_groups[0]["params"], strict=True):
            p.copy_(kept)
        self.optimizer.state.clear()
        self.n_steps, self.n_tokens = self.last_good["step"], self.last_good["tokens"]
        self.steps_since_fired.copy_(self.last_good["steps_since_fired"])
        self.log[:] = [e for e in self.log if e["step"] <= self.n_steps]
        return self.n_steps

    def _refuse(self, x: Tensor, step: int, loss: Tensor | None) -> None:
        """Raise NonFiniteTrainingError for step `step`: a NaN / inf batch (the weights untouched),
        or a non-finite loss on a finite batch (training diverged: roll back)."""
        bad = self._first_bad(x)
        if bad is not None:
            first, n_bad, n_values = bad
            last = self.n_steps if self._weights_finite() else self._roll_back()
            raise NonFiniteTrainingError(
                f"{self._name}: the batch of step {step} holds {first} "
                f"({n_bad} of its {n_values} values are NaN or inf); refused before it changed the "
                f"weights. {self._state_words(last)}",
                step,
                last,
            )
        last = self._roll_back()
        raise NonFiniteTrainingError(
            f"{self._name}: the loss at step {step} is {float(loss.detach()) if loss is not None else 'nan'} on a finite "
            f"batch: training diverged (lr={self.cfg.lr:g}; lower cfg.lr or add cfg.lr_warm_up_steps). "
            f"{self._state_words(last)}",
            step,
            last,
        )

    def _state_words(self, last: int | None) -> str:
        if last is None:
            nan = ", which hold NaN or inf" if not self._weights_finite() else ""
            return (
                f"No good state was kept to roll back to (cfg.keep_last_good={self.cfg.keep_last_good}): "
                f"the {self._what} {self._holds} weights after step {self.n_steps}{nan}"
            )
        state = "initial weights" if last == 0 else f"state after step {last}"
        return f"The {self._what} {self._holds} {state}, the last good one"

    # ----- the loop -----------------------------------------------------------------
    def train(self, batches: Iterable[Tensor], n_steps: int, progress: bool = True) -> list[dict[str, float]]:
        """Run `n_steps` steps on `batches`; every `cfg.log_every` steps (and at the end) append
        {step, tokens, loss, mse, l0, explained_variance, dead_fraction, lr, [l1 | aux],
        [ce_loss_recovered]} to `self.log` (training-batch metrics; CE on `eval_tokens`). Returns the log.

        Example:
            >>> trainer.train(activation_batches(model, hook, texts), n_steps=2000)[-1]["l0"]
        """
        n_steps = self.begin(n_steps)
        bar = tqdm(total=n_steps, desc=f"train {self._what}", unit="step", disable=not progress)
        it = iter(batches)
        start = time.perf_counter()
        try:
            for _ in range(n_steps):
                x = next(it, None)
                if x is None:
                    raise ValueError(f"batches: ran out after {self.n_steps} steps (n_steps asked {n_steps} more)")
                entry = self.record(x, self.step(x), start)
                if entry is not None:
                    bar.set_postfix(
                        {k: f"{entry[k]:.3g}" for k in ("l0", "mse", "explained_variance", "dead_fraction")}
                    )
                bar.update(1)
        finally:
            bar.close()
        self.finish()
        return self.log

    # ----- the loop's parts, for a loop run from outside (MultiSAETrainer steps several in lockstep) -------
    def begin(self, n_steps: int) -> int:
        """Start a run of `n_steps` more steps (the end the learning-rate decay aims at); returns it checked."""
        n_steps = check_int_in_range(n_steps, "n_steps", 1, None)
        self.total_steps = self.n_steps + n_steps
        return n_steps

    def record(self, x: Tensor, parts: dict[str, Tensor], start: float) -> dict[str, float] | None:
        """After `parts = step(x)`: the log entry, every `cfg.log_every` steps and at the run's last (with the
        CE loss recovered every `cfg.eval_every` steps and at the last, given a model), or None between;
        `start` is the run's `time.perf_counter()` at its start (for tokens_per_s)."""
        last = self.n_steps == self.total_steps
        if self.n_steps % self.cfg.log_every and not last:
            return None
        entry = self._entry(x, parts)
        entry["tokens_per_s"] = self.n_tokens / max(time.perf_counter() - start, 1e-9)
        ev = self.cfg.eval_every
        if self.model is not None and (last or (ev and self.n_steps % ev == 0)):
            entry.update(self.evaluate())
        self.log.append(entry)
        return entry

    def finish(self) -> None:
        """The run's end: the last step's update may have left NaN / inf in the weights (no later loss
        shows it): roll back to the last good state and raise `NonFiniteTrainingError`."""
        if not self._weights_finite():
            step, kept = self.n_steps, self._roll_back()
            raise NonFiniteTrainingError(
                f"{self._name}: step {step} left NaN or inf in the weights: training diverged "
                f"(lr={self.cfg.lr:g}; lower cfg.lr). {self._state_words(kept)}",
                step,
                kept,
            )

    @torch.no_grad()
    def _entry(self, x: Tensor, parts: dict[str, Tensor]) -> dict[str, float]:
        x = x.to(self.sae.device, self.sae.dtype)
        feats = parts["feats"]
        x_hat = parts["x_hat"] if "x_hat" in parts else self.sae.arch.decode(self.sae, feats)
        entry = {
            "step": float(self.n_steps),
            "tokens": float(self.n_tokens),
            "loss": float(parts["loss"]),
            "mse": float(parts["mse"]),
            "l0": float((feats != 0).float().sum(-1).mean()),
            "explained_variance": explained_variance(x, x_hat),
            "dead_fraction": self.dead_fraction,
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        for k, v in parts.items():  # the architecture's loss terms (l1, aux, l0, ...)
            if k not in entry and k not in ("feats", "x_hat") and v.ndim == 0:
                entry[k] = float(v)
        return entry

    def evaluate(self) -> dict[str, float]:
        """`evaluate_sae` on the trainer's eval tokens, keys prefixed 'val_'."""
        assert self.model is not None and self.eval_tokens is not None
        return {f"val_{k}": v for k, v in evaluate_sae(self.model, self.sae, self.eval_tokens).items()}
