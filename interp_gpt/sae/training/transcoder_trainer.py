"""`TranscoderTrainer`: the SAE trainer's machinery (Adam, the lr schedule, the NaN rules, the last good
state, dead-feature accounting, the config checks) on paired batches: each layer's MLP input (what a
transcoder reads) and its MLP output (what it predicts).

It trains one per-layer transcoder (PLT, with or without a skip), a set of PLTs (one per layer, one step
for all), or a cross-layer transcoder (CLT: layer s's features decode into every layer m >= s). Losses:
  * reconstruction: `sum_m ((y_hat_m - y_m) ** 2).sum(-1).mean()`: each output layer's squared error
    summed over d_out, averaged over rows (the SAE's), summed over the output layers;
  * "relu": `+ l1_coefficient * sum_s (f_s * ||W_dec_s[i]||).sum(-1).mean()`, the SAE's decoder-norm
    weighted L1; a CLT feature's norm is that of all its decoders together (into layers s, s+1, ...);
  * "topk": AuxK as the SAE's: per layer, the `k_aux = max(1, d_out // 2)` largest pre-activations of its
    dead features predict the residual `y - y_hat` of the layers they write (their own for a PLT);
  * BatchTopK (a JumpReLU transcoder whose metadata says so: `batchtopk_metadata(k)`): per layer the
    `int(k * n)` largest positive pre-activations over the batch's n rows (the SAE's `batch_topk`), TopK's
    AuxK, and after each step the running threshold of the SAE's BatchTopK (`new_threshold`, float64,
    `cfg.topk_threshold_lr`), one per layer, written into the transcoder's threshold for every feature:
    the transcoder itself computes (and saves as) the JumpReLU with that threshold;
  * "jumprelu": sae-lens 6's JumpReLU training (DeepMind's): the gate `h * (h > threshold)` and an L0
    penalty `l0_coefficient * sum_s (h_s > threshold_s).sum(-1).mean()`, both with straight-through
    estimators that pass a gradient to the threshold through a rectangle kernel of width
    `jumprelu_bandwidth` around it (the L0's to the threshold only); thresholds start at
    `jumprelu_init_threshold` and are projected back to >= 0 after every step.
Decoder rows (a CLT feature's decoders taken together) are kept at unit norm with `normalize_decoder`
(default: TopK and BatchTopK). A feature is dead when it has not fired in `dead_feature_window` batches.

Batches are `(inputs, targets)`: `[batch, d_in]` and `[batch, d_out]` for one PLT, `[n_layers, batch, d_in]`
and `[n_layers, batch, d_out]` for a set or a CLT; or a dict hook -> rows, as an `ActivationStore` on
`trainer.hooks` serves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...checks import check_tokens
from ..saes.architectures.batchtopk import batch_topk, new_threshold
from ..saes.evaluation import explained_variance
from ..transcoders.clt import CrossLayerTranscoder
from ..transcoders.config import batchtopk_k
from ..transcoders.evaluation import evaluate_transcoders, transcoder_set
from ..transcoders.transcoder import Transcoder
from .sae_trainer import INT_FIELDS, SAETrainer, SAETrainingConfig, check_non_negative

__all__ = ["TranscoderTrainingConfig", "TranscoderTrainer"]


@dataclass
class TranscoderTrainingConfig(SAETrainingConfig):
    """`SAETrainingConfig`'s fields plus JumpReLU's (sae-lens 6's names and defaults).

    Example:
        >>> TranscoderTrainingConfig(lr=1e-3, l0_coefficient=0.5)
    """

    l0_coefficient: float = 1.0  # "jumprelu" only: weight of the L0 penalty
    l0_warm_up_steps: int = 0
    jumprelu_init_threshold: float = 0.01
    jumprelu_bandwidth: float = 0.05  # width of the straight-through estimator's window

    def validate(self) -> None:
        """Every field by name (the SAE config's checks, then JumpReLU's)."""
        super().validate()
        where = type(self).__name__
        for name in ("l0_coefficient", "jumprelu_init_threshold"):
            setattr(self, name, check_non_negative(getattr(self, name), name, where))
        self.jumprelu_bandwidth = check_non_negative(self.jumprelu_bandwidth, "jumprelu_bandwidth", where)
        if self.jumprelu_bandwidth == 0:
            raise ValueError(f"{where}: jumprelu_bandwidth=0.0 is out of range: expected a finite number > 0")

    def _int_fields(self) -> dict[str, int]:
        return {**INT_FIELDS, "l0_warm_up_steps": 0}


# ----------------------------------------------------------------------------------------------
# JumpReLU's straight-through estimators (after sae-lens 6 / DeepMind's JumpReLU paper)
# ----------------------------------------------------------------------------------------------
def _window(pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
    """The rectangle kernel around the threshold, (1 / bandwidth) where |pre - threshold| < bandwidth / 2."""
    return ((pre - threshold).abs() < bandwidth / 2).to(pre.dtype) / bandwidth


def _sum_to(grad: Tensor, threshold: Tensor) -> Tensor:
    """A gradient [..., d_sae] summed over the leading axes onto the threshold's [d_sae]."""
    return grad.reshape(-1, grad.shape[-1]).sum(0).reshape(threshold.shape)


class _JumpGate(torch.autograd.Function):
    """`pre * (pre > threshold)`: the exact gradient to `pre`; to the threshold the derivative of the
    jump, -threshold x the kernel (the activation drops from `threshold` to 0 there)."""

    @staticmethod
    def forward(ctx: Any, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        pre, threshold = ctx.saved_tensors
        open_ = (pre > threshold).to(grad.dtype)
        to_threshold = -threshold * _window(pre, threshold, ctx.bandwidth) * grad
        return open_ * grad, _sum_to(to_threshold, threshold), None


class _Heaviside(torch.autograd.Function):
    """`(pre > threshold)`, the L0's count: no gradient to `pre`, -kernel to the threshold."""

    @staticmethod
    def forward(ctx: Any, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:  # type: ignore[override]
        pre, threshold = ctx.saved_tensors
        return None, _sum_to(-_window(pre, threshold, ctx.bandwidth) * grad, threshold), None


# ----------------------------------------------------------------------------------------------
# the trainer
# ----------------------------------------------------------------------------------------------
class TranscoderTrainer(SAETrainer):
    """Train transcoders in place with Adam on paired batches (see the module's docs for the losses).

    Args:
        transcoders: a `Transcoder`, a list of them (one per layer; same architecture and widths), or a
            `CrossLayerTranscoder`.
        cfg: a `TranscoderTrainingConfig`.
        model, eval_tokens: when given, the log reports `evaluate_transcoders` on `eval_tokens`
            ("val_" keys) every `cfg.eval_every` steps and at the end.

    Example:
        >>> tcs = [Transcoder(TranscoderConfig(d_in=128, d_sae=512, d_out=128, architecture="topk", k=16,
        ...         skip=True, metadata={"hook_name": f"blocks.{l}.ln2.hook_normalized",
        ...                              "hook_name_out": f"blocks.{l}.hook_mlp_out"})) for l in range(2)]
        >>> trainer = TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=1e-3))
        >>> store = ActivationStore(model, trainer.hooks, texts, context_size=128)
        >>> log = trainer.train(store, n_steps=1000)
    """

    _name, _what, _holds = "TranscoderTrainer", "transcoders", "hold their"

    def __init__(
        self,
        transcoders: Transcoder | list[Transcoder] | CrossLayerTranscoder,
        cfg: TranscoderTrainingConfig | None = None,
        model: Any = None,
        eval_tokens: Tensor | None = None,
    ) -> None:
        self.module, self.tcs, self.clt = transcoder_set(transcoders, "TranscoderTrainer", "transcoders")
        self.single = isinstance(transcoders, Transcoder)
        if cfg is not None and not isinstance(cfg, TranscoderTrainingConfig):
            raise TypeError(f"TranscoderTrainer: cfg: expected a TranscoderTrainingConfig, got {type(cfg).__name__}")
        self.cfg: TranscoderTrainingConfig = cfg or TranscoderTrainingConfig()
        self.cfg.validate()
        if (model is None) != (eval_tokens is None):
            raise ValueError(
                "TranscoderTrainer: model and eval_tokens: pass both (for the CE loss recovered) or neither"
            )
        if model is not None and eval_tokens is not None:  # what the evaluations need, checked before step 1
            eval_tokens = check_tokens(
                eval_tokens, model.cfg.d_vocab, model.cfg.n_ctx, "eval_tokens", caller="TranscoderTrainer"
            )
            evaluate_transcoders(model, transcoders, eval_tokens[:1])
        self.model, self.eval_tokens = model, eval_tokens
        c = self.clt.cfg if self.clt is not None else self.tcs[0].cfg
        self.arch, self.k, self.skip, self.nonnegative = c.architecture, c.k, c.skip, c.nonnegative_acts
        self.d_in, self.d_sae, self.d_out = c.d_in, c.d_sae, c.d_out
        self.n_layers = self.clt.n_layers if self.clt is not None else len(self.tcs)
        self.batch_k = batchtopk_k(c)  # BatchTopK's k (a JumpReLU trained as BatchTopK), else None
        self._same_training([tc.cfg for tc in self.tcs] if self.clt is None else [c])
        # how it trains: its architecture's loss, or BatchTopK's (its JumpReLU threshold is then set, not learnt)
        self.training_architecture = "batchtopk" if self.batch_k is not None else self.arch
        self.topk = self.training_architecture in ("topk", "batchtopk")  # AuxK, a unit-norm decoder by default
        device = self.clt.device if self.clt is not None else self.tcs[0].device
        self.dtype = self.clt.dtype if self.clt is not None else self.tcs[0].dtype
        self._start(list(self.module.parameters()), (self.n_layers, self.d_sae), device)
        self.device = device
        self._batch: tuple[Tensor, Tensor] | None = None
        # BatchTopK's running thresholds, one per layer, in float64 as the SAE's (sae-lens' topk_threshold);
        # from the transcoders' own (their mean over features) until the first step initialises them to 0
        self.topk_threshold = torch.zeros(self.n_layers, dtype=torch.float64, device=device)
        if self.batch_k is not None:
            self.topk_threshold.copy_(
                torch.cat([t.detach().reshape(-1, self.d_sae) for t in self._thresholds()]).mean(-1)
            )

    def _same_training(self, cfgs: list[Any]) -> None:
        """Refuse a set whose transcoders train differently (BatchTopK or not, another k), by name."""

        def how(k: float | None) -> str:
            return f"BatchTopK (k={k})" if k is not None else self.arch

        for i, cfg in enumerate(cfgs[1:], 1):
            if batchtopk_k(cfg) != self.batch_k:
                raise ValueError(
                    f"TranscoderTrainer: transcoders[{i}] trains as {how(batchtopk_k(cfg))} but transcoders[0] as "
                    f"{how(self.batch_k)}: a set trains one way (see batchtopk_metadata)"
                )

    # ----- where each layer's tensors are ---------------------------------------------------
    @property
    def layers(self) -> list[int]:
        """The model layer of each position of the set (a CLT's: 0..n_layers-1)."""
        if self.clt is not None:
            return list(range(self.n_layers))
        return [tc.layer if tc.layer is not None else i for i, tc in enumerate(self.tcs)]

    @property
    def hooks(self) -> list[str]:
        """The model hooks a dict batch holds: each layer's input hook, then its output hook."""
        out: list[str] = []
        for i in range(self.n_layers):
            pair = (
                (self.clt.input_hook(i), self.clt.output_hook(i))
                if self.clt
                else (self.tcs[i].input_hook, self.tcs[i].output_hook)
            )
            if pair[0] is None or pair[1] is None:
                raise ValueError(
                    f"TranscoderTrainer: layer {self.layers[i]}'s cfg.metadata.hook_name / hook_name_out are not set "
                    "(needed to read dict batches); pass (inputs, targets) tuples instead"
                )
            out += [pair[0], pair[1]]
        return out

    def _enc(self, s: int) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.clt is not None:
            t = self.clt.threshold[s] if self.arch == "jumprelu" else None
            return self.clt.W_enc[s], self.clt.b_enc[s], t
        tc = self.tcs[s]
        return tc.W_enc, tc.b_enc, tc.threshold if self.arch == "jumprelu" else None

    def _decoders(self) -> list[Tensor]:
        """Source layer s's decoders, feature i's row `w[i]` (a CLT's: [n_layers - s, d_out], into s, s+1 ...)."""
        return list(self.clt.W_dec) if self.clt is not None else [tc.W_dec for tc in self.tcs]

    def _targets(self, s: int) -> range:
        """The output layers source layer s writes."""
        return range(s, self.n_layers) if self.clt is not None else range(s, s + 1)

    def _b_dec(self, m: int) -> Tensor:
        return self.clt.b_dec[m] if self.clt is not None else self.tcs[m].b_dec

    def _w_skip(self, m: int) -> Tensor:
        return self.clt.W_skip[m] if self.clt is not None else self.tcs[m].W_skip

    def _thresholds(self) -> list[Tensor]:
        if self.arch != "jumprelu":
            return []
        return [self.clt.threshold] if self.clt is not None else [tc.threshold for tc in self.tcs]

    # ----- the batch ------------------------------------------------------------------------------
    def _check_batch(self, batch: Any, step: int) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        where = f"{self._name}: the batch of step {step}"
        n = self.n_layers
        if isinstance(batch, dict):
            hooks = self.hooks
            missing = [h for h in hooks if h not in batch]
            if missing:
                raise KeyError(
                    f"{where} lacks {missing[0]!r} (it holds {sorted(batch)[:6]}); expected every hook of "
                    f"trainer.hooks: {hooks}"
                )
            parts = [batch[h] for h in hooks]
            for h, t in zip(hooks, parts, strict=True):
                self._check_rows(t, f"{where}: {h!r}", step)
            pair = (torch.stack(parts[0::2]), torch.stack(parts[1::2]))
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            pair = (batch[0], batch[1])
        else:
            raise TypeError(f"{where} must be (inputs, targets) or a dict hook -> rows, got {type(batch).__name__}")
        lead = "" if self.single else f"n_layers={n}, "
        out = []
        for t, arg, width, axis in ((pair[0], "inputs", self.d_in, "d_in"), (pair[1], "targets", self.d_out, "d_out")):
            want = f"expected [{lead}batch, {axis}={width}]"
            if not isinstance(t, Tensor):
                raise TypeError(f"{where}: {arg} must be a tensor, {want}; got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"{where}: {arg} have dtype {t.dtype}, {want} of floats")
            t = t.unsqueeze(0) if self.single and t.ndim == 2 else t
            if t.ndim != 3 or t.shape[0] != n or t.shape[2] != width or t.shape[1] == 0:
                raise ValueError(f"{where}: {arg} have shape {tuple(pair[0 if arg == 'inputs' else 1].shape)}, {want}")
            out.append(t.to(self.device, self.dtype))
        if out[0].shape[1] != out[1].shape[1]:
            raise ValueError(
                f"{where}: inputs hold {out[0].shape[1]} rows but targets {out[1].shape[1]}: expected the same rows"
            )
        self._batch = (out[0], out[1])
        return self._batch

    def _check_rows(self, t: Any, where: str, step: int) -> None:
        if not isinstance(t, Tensor) or t.ndim != 2:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{where}: expected rows [batch, width], got {shape}")

    def _first_bad(self, batch: Any) -> tuple[str, int, int] | None:
        xs, ys = batch
        for arg, t in (("inputs", xs), ("targets", ys)):
            bad = ~torch.isfinite(t)
            if bool(bad.any()):
                s, row, col = bad.nonzero()[0].tolist()
                n_bad = int((~torch.isfinite(xs)).sum() + (~torch.isfinite(ys)).sum())
                where = f"the {arg} of layer {self.layers[s]}"
                return (
                    f"{t[s, row, col].item()} in {where} at [row {row}, column {col}]",
                    n_bad,
                    xs.numel() + ys.numel(),
                )
        return None

    def _n_rows(self, batch: Any) -> int:
        return int(batch[0].shape[1])

    # ----- initialisation, the losses, the projections -----------------------------------------------
    def _before_update(self, parts: dict[str, Tensor]) -> None:
        """(Transcoders have no per-architecture step work.)"""

    def _after_update(self, parts: dict[str, Tensor]) -> None:
        """BatchTopK: the step's running thresholds, kept (float64) and written into every feature's threshold."""
        if self.batch_k is None:
            return
        self.topk_threshold.copy_(parts["topk_threshold"])
        for s, t in enumerate(self._thresholds()):  # a CLT's one [n_layers, d_sae] tensor, or one per PLT
            t.copy_(self.topk_threshold.view(-1, 1).expand(t.shape) if t.ndim == 2 else self.topk_threshold[s])

    def _keep_last_good(self) -> None:
        super()._keep_last_good()
        if self.last_good is not None and self.last_good["step"] == self.n_steps:
            self.last_good["topk_threshold"] = self.topk_threshold.clone()

    def _roll_back(self) -> int | None:
        step = super()._roll_back()
        if self.last_good is not None and "topk_threshold" in self.last_good:
            self.topk_threshold.copy_(self.last_good["topk_threshold"])
        return step

    @torch.no_grad()
    def _initialise(self, batch: Any) -> None:  # type: ignore[override]
        """Decoder rows random unit vectors (x 0.1 without unit-norm decoders, as the SAE's standard init),
        encoder columns random unit vectors, b_dec each layer's mean target, thresholds at
        `jumprelu_init_threshold`, biases and skips 0."""
        _, ys = batch
        gen = torch.Generator().manual_seed(self.cfg.seed)
        scale = 1.0 if self.normalize_decoder or self.topk else 0.1
        for s, w_dec in enumerate(self._decoders()):
            w = torch.randn(w_dec.shape, generator=gen, dtype=torch.float32)
            w_dec.copy_(w / w.flatten(1).norm(dim=-1).view(-1, *[1] * (w.ndim - 1)) * scale)
            w_enc, b_enc, _ = self._enc(s)
            e = torch.randn(w_enc.shape, generator=gen, dtype=torch.float32)
            w_enc.copy_(e / e.norm(dim=0, keepdim=True))
            b_enc.zero_()
        for m in range(self.n_layers):
            self._b_dec(m).copy_(ys[m].mean(0) if self.cfg.init_b_dec_to_mean else torch.zeros(self.d_out))
            if self.skip:
                self._w_skip(m).zero_()
        for t in self._thresholds():  # BatchTopK's running threshold starts at 0, as the SAE's
            t.fill_(self.cfg.jumprelu_init_threshold if self.batch_k is None else 0.0)
        self.topk_threshold.zero_()
        self._initialised = True

    def _after_step(self) -> None:
        for t in self._thresholds():  # a negative threshold would let negative pre-activations through
            t.clamp_(min=0.0)

    def _coefficient(self, value: float, warm: int) -> float:
        return value * (min(1.0, (self.n_steps + 1) / warm) if warm else 1.0)

    def losses(self, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:  # type: ignore[override]
        """The loss on a checked batch `(inputs [L, n, d_in], targets [L, n, d_out])` and its parts (mse,
        l1 / aux / l0_loss), the features `feats` [L, n, d_sae] and the prediction `y_hat` [L, n, d_out]."""
        xs, ys = batch
        n, c = xs.shape[1], self.cfg
        outs: list[Tensor | None] = [None] * self.n_layers
        feats, pres, sparsity, running = [], [], [], []
        fired = torch.zeros(self.n_layers, self.d_sae, dtype=torch.bool, device=xs.device)
        decoders = self._decoders()
        for s in range(self.n_layers):
            w_enc, b_enc, threshold = self._enc(s)
            pre = torch.addmm(b_enc, xs[s], w_enc)  # [n, d_sae]
            w = decoders[s].reshape(self.d_sae, -1)  # [d_sae, n_targets * d_out]
            if self.batch_k is not None:  # the int(k * n) largest over the batch, decoded row by row
                chosen = batch_topk(pre, self.batch_k)
                contrib = F.embedding_bag(
                    chosen.features, w, chosen.offsets, mode="sum", per_sample_weights=chosen.values
                )
                with torch.no_grad():
                    feat = chosen.dense(n, self.d_sae)
                    running.append(new_threshold(self.topk_threshold[s], chosen.values, c.topk_threshold_lr))
            elif self.topk:
                assert self.k is not None
                values, indices = torch.topk(pre, k=self.k, dim=-1, sorted=False)
                acts = values.relu() if self.nonnegative else values
                contrib = F.embedding_bag(indices, w, per_sample_weights=acts, mode="sum")
                with torch.no_grad():
                    feat = torch.zeros_like(pre).scatter_(-1, indices, acts)
            else:
                if threshold is not None:
                    feat = _JumpGate.apply(pre, threshold, c.jumprelu_bandwidth)
                    count = _Heaviside.apply(pre, threshold, c.jumprelu_bandwidth)
                    sparsity.append(count.sum(-1).mean())
                else:
                    feat = torch.relu(pre)
                    sparsity.append((feat * decoders[s].flatten(1).norm(dim=-1)).sum(-1).mean())
                contrib = feat @ w
            with torch.no_grad():
                fired[s] = (feat != 0).any(0)
            contrib = contrib.view(n, -1, self.d_out)
            for j, m in enumerate(self._targets(s)):
                prev = outs[m]
                outs[m] = contrib[:, j] if prev is None else prev + contrib[:, j]
            feats.append(feat.detach())
            pres.append(pre)
        y_hat = []
        for m in range(self.n_layers):
            out = outs[m]
            assert out is not None
            out = out + self._b_dec(m)
            if self.skip:
                out = out + xs[m] @ self._w_skip(m).T
            y_hat.append(out)
        mse = sum((y_hat[m] - ys[m]).pow(2).sum(-1).mean() for m in range(self.n_layers))
        assert isinstance(mse, Tensor)
        self._fired = fired
        parts = {"mse": mse, "feats": torch.stack(feats), "y_hat": torch.stack([y.detach() for y in y_hat])}
        loss = mse
        if running:
            parts["topk_threshold"] = torch.stack(running)  # [L] float64, taken into the trainer after the step
        if self.training_architecture == "relu":
            parts["l1"] = self._coefficient(c.l1_coefficient, c.l1_warm_up_steps) * sum(sparsity)  # type: ignore[assignment]
            loss = loss + parts["l1"]
        elif self.training_architecture == "jumprelu":
            parts["l0_loss"] = self._coefficient(c.l0_coefficient, c.l0_warm_up_steps) * sum(sparsity)  # type: ignore[assignment]
            loss = loss + parts["l0_loss"]
        else:
            aux = self._aux_loss(pres, ys, y_hat, decoders)
            if aux is not None:
                parts["aux"] = aux
                loss = loss + aux
        return loss, parts

    def _aux_loss(self, pres: list[Tensor], ys: Tensor, y_hat: list[Tensor], decoders: list[Tensor]) -> Tensor | None:
        """AuxK: per source layer, its dead features' top pre-activations predict the residual of the
        layers it writes (the SAE's rule, on the transcoder's residual `y - y_hat`)."""
        total: Tensor | None = None
        dead_all = self.steps_since_fired >= self.cfg.dead_feature_window
        for s, pre in enumerate(pres):
            dead = dead_all[s]
            n_dead = int(dead.sum())
            if not n_dead:
                continue
            k_aux = max(1, self.d_out // 2)
            scale = min(n_dead / k_aux, 1.0)
            k_aux = min(k_aux, n_dead)
            masked = torch.where(dead[None], pre, -torch.inf)
            values, indices = masked.topk(k_aux, dim=-1, sorted=False)
            aux_hat = F.embedding_bag(
                indices, decoders[s].reshape(self.d_sae, -1), per_sample_weights=values, mode="sum"
            )
            targets = list(self._targets(s))
            residual = torch.cat([(ys[m] - y_hat[m]).detach() for m in targets], dim=-1)
            term = self.cfg.aux_coefficient * scale * (aux_hat - residual).pow(2).sum(-1).mean()
            total = term if total is None else total + term
        return total

    # ----- the log --------------------------------------------------------------------------------
    @torch.no_grad()
    def _entry(self, batch: Any, parts: dict[str, Tensor]) -> dict[str, float]:
        assert self._batch is not None
        _, ys = self._batch
        feats, y_hat = parts["feats"], parts["y_hat"]
        l0 = (feats != 0).float().sum(-1).mean(-1)  # [L]
        ev = [explained_variance(ys[m], y_hat[m]) for m in range(self.n_layers)]
        entry = {
            "step": float(self.n_steps),
            "tokens": float(self.n_tokens),
            "loss": float(parts["loss"]),
            "mse": float(parts["mse"]),
            "l0": float(l0.mean()),
            "explained_variance": sum(ev) / len(ev),
            "dead_fraction": self.dead_fraction,
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        for i, layer in enumerate(self.layers):
            entry[f"explained_variance.{layer}"] = ev[i]
            entry[f"l0.{layer}"] = float(l0[i])
        for k in ("l1", "aux", "l0_loss"):
            if k in parts:
                entry[k] = float(parts[k])
        if "topk_threshold" in parts:  # BatchTopK's running thresholds after this step (as the SAE logs it)
            entry["topk_threshold"] = float(parts["topk_threshold"].mean())
            for i, layer in enumerate(self.layers):
                entry[f"topk_threshold.{layer}"] = float(parts["topk_threshold"][i])
        return entry

    def evaluate(self) -> dict[str, float]:
        """`evaluate_transcoders` on the trainer's eval tokens (its numbers), keys prefixed 'val_'."""
        assert self.model is not None and self.eval_tokens is not None
        got = evaluate_transcoders(self.model, self.module, self.eval_tokens)
        return {f"val_{k}": v for k, v in got.items() if isinstance(v, float)}
