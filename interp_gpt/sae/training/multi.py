"""Many SAEs from one forward: `MultiSAETrainer` steps one `SAETrainer` per SAE, in lockstep, each on its own
hook's rows of one stream of multi-hook batches; `train_saes` makes that stream with the activation store
(one model forward per batch of windows, whichever the number of SAEs) and trains.

Each SAE keeps its own `SAETrainer` (optimiser, learning-rate schedule, L1 warm-up, dead-feature count, log,
NaN handling), so it ends bit-identical to `SAETrainer(sae, cfg).train(batches, n_steps)` alone on the same
batches (`tests/test_sae_multi.py`). An SAE stopped by NaN / inf drops out (its trainer has refused the step
or rolled back, as alone); the others train to the end, then `MultiTrainingError` names each one stopped.
Only the batch being trained on is held: memory is the store's (see `train_saes`' `keep_in_memory`).

    >>> saes = {f"w{w}": SAE(SAEConfig(d_in=128, d_sae=w, architecture="topk", k=32,
    ...                                metadata={"hook_name": "blocks.1.hook_resid_pre"})) for w in (512, 1024)}
    >>> trainer = train_saes(model, saes, texts, n_steps=1000)
    >>> trainer.logs["w512"][-1]["explained_variance"]
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ...checks import check_int_in_range
from ...files import write_atomic
from ...utils import hook_shape
from ..saes.core import SAE
from .data import activation_batches
from .sae_trainer import NonFiniteTrainingError, SAETrainer, SAETrainingConfig

__all__ = ["MultiSAETrainer", "MultiTrainingError", "train_saes", "sae_name", "check_fit", "save_trained_saes"]


class MultiTrainingError(ValueError):
    """Some SAEs of a lockstep run stopped on NaN / inf; the others trained to the end. `errors` maps each
    stopped SAE's name to its `NonFiniteTrainingError` (its step, and the step its weights are from)."""

    def __init__(self, message: str, errors: dict[str, NonFiniteTrainingError]) -> None:
        super().__init__(message)
        self.errors = errors


def sae_name(sae: SAE) -> str:
    """The name an SAE gets when none is given, and its folder under train-sae's --out:
    `<hook>-<architecture>-<d_sae>`.

    Example:
        >>> sae_name(SAE(SAEConfig(d_in=128, d_sae=512, architecture="topk", k=8,
        ...                        metadata={"hook_name": "blocks.1.hook_resid_pre"})))
        'blocks.1.hook_resid_pre-topk-512'
    """
    return f"{sae.cfg.hook_name}-{sae.cfg.architecture}-{sae.cfg.d_sae}"


def _check_sae(sae: Any, where: str) -> SAE:
    if not isinstance(sae, SAE):
        raise TypeError(f"{where}: expected an interp_gpt SAE, got {type(sae).__name__}")
    if not sae.cfg.hook_name:
        raise ValueError(
            f"{where}: cfg.metadata.hook_name is not set; each SAE trains on its hook's rows "
            "(SAEConfig(..., metadata={'hook_name': 'blocks.1.hook_resid_pre'}))"
        )
    return sae


def _named(saes: Any) -> dict[str, SAE]:
    """`saes` (a mapping name -> SAE, or a sequence named by `sae_name`) checked: SAEs with a hook, each once."""
    named: dict[str, SAE] = {}
    if isinstance(saes, Mapping):
        for name, sae in saes.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"saes: names must be non-empty strings, got {name!r}")
            named[name] = _check_sae(sae, f"saes[{name!r}]")
    elif isinstance(saes, Sequence) and not isinstance(saes, (str, bytes)):
        for i, sae in enumerate(saes):
            name = sae_name(_check_sae(sae, f"saes[{i}]"))
            if name in named:
                raise ValueError(
                    f"saes[{i}]: a second SAE named {name!r} (<hook>-<architecture>-<d_sae>); "
                    "pass a dict name -> SAE to name them apart"
                )
            named[name] = sae
    else:
        raise TypeError(f"saes: expected a dict name -> SAE or a list of SAEs, got {type(saes).__name__}")
    if not named:
        raise ValueError("saes: expected at least one SAE, got none")
    seen: dict[int, str] = {}
    for name, sae in named.items():
        if id(sae) in seen:
            raise ValueError(f"saes[{name!r}] is the same SAE object as saes[{seen[id(sae)]!r}]; each trains in place")
        seen[id(sae)] = name
    return named


def _configs(cfg: Any, names: list[str]) -> dict[str, SAETrainingConfig]:
    """One config per SAE (copies: a trainer may change its own): one for all, a list in order, or a dict by name."""
    if cfg is None or isinstance(cfg, SAETrainingConfig):
        one = cfg or SAETrainingConfig()
        return {n: copy.deepcopy(one) for n in names}
    if isinstance(cfg, Mapping):
        missing, extra = [n for n in names if n not in cfg], [n for n in cfg if n not in names]
        if missing or extra:
            raise ValueError(f"cfg: its names must be the SAEs' names; missing {missing}, unknown {extra}")
        cfgs = [cfg[n] for n in names]
    elif isinstance(cfg, Sequence) and not isinstance(cfg, (str, bytes)):
        if len(cfg) != len(names):
            raise ValueError(f"cfg: {len(cfg)} configs for {len(names)} SAEs; give one per SAE, in their order")
        cfgs = list(cfg)
    else:
        raise TypeError(f"cfg: expected a SAETrainingConfig, a list or a dict of them, got {type(cfg).__name__}")
    for n, c in zip(names, cfgs, strict=True):
        if not isinstance(c, SAETrainingConfig):
            raise TypeError(f"cfg[{n!r}]: expected a SAETrainingConfig, got {type(c).__name__}")
    return {n: copy.deepcopy(c) for n, c in zip(names, cfgs, strict=True)}


def check_fit(model: Any, saes: Mapping[str, SAE]) -> None:
    """Each SAE's hook is one of `model`'s, holding one vector per token of the SAE's d_in (else a
    KeyError / ValueError naming the SAE, its hook and what fits)."""
    for name, sae in saes.items():
        hook = sae.cfg.hook_name
        try:
            model.hook_points(hook, arg=f"saes[{name!r}].cfg.hook_name")
        except KeyError as e:
            raise KeyError(f"saes[{name!r}]: {e.args[0]}") from None
        shape = hook_shape(model.cfg, str(hook))
        if shape is None:
            raise ValueError(
                f"saes[{name!r}]: hook {hook!r} holds no vector per token; train on resid, mlp_out, hook_z"
            )
        if math.prod(shape) != sae.cfg.d_in:
            per_head = f" ({' x '.join(map(str, shape))} per token, flattened)" if len(shape) > 1 else ""
            raise ValueError(
                f"saes[{name!r}]: d_in={sae.cfg.d_in} does not fit hook {hook!r}, whose rows are "
                f"{math.prod(shape)} wide{per_head}"
            )


class MultiSAETrainer:
    """Train several SAEs in lockstep on one stream of batches, one `SAETrainer` each.

    Args:
        saes: a dict name -> SAE, or a list of SAEs (named `sae_name(sae)`: `<hook>-<architecture>-<d_sae>`).
            Each SAE trains on the rows of its `cfg.hook_name`; several may share a hook.
        cfg: a `SAETrainingConfig` for all (each trainer gets a copy), or one per SAE (a list in order,
            or a dict by name).
        model, eval_tokens: as `SAETrainer`'s (the CE loss recovered on eval_tokens in each log); with a
            model, each SAE's hook and d_in are checked against it.

    Example:
        >>> trainer = MultiSAETrainer([sae_a, sae_b], SAETrainingConfig(lr=4e-4))
        >>> logs = trainer.train(activation_batches(model, [sae_a.cfg.hook_name, sae_b.cfg.hook_name], texts),
        ...                      n_steps=1000)
    """

    def __init__(self, saes: Any, cfg: Any = None, model: Any = None, eval_tokens: Tensor | None = None) -> None:
        named = _named(saes)
        cfgs = _configs(cfg, list(named))
        if model is not None:
            check_fit(model, named)
        self.trainers: dict[str, SAETrainer] = {}
        for name, sae in named.items():
            try:
                self.trainers[name] = SAETrainer(sae, cfgs[name], model, eval_tokens)
            except (TypeError, ValueError) as e:
                if type(e) not in (TypeError, ValueError):
                    raise
                raise type(e)(f"saes[{name!r}]: {e}") from None
        self.hooks = {name: str(sae.cfg.hook_name) for name, sae in named.items()}
        self.errors: dict[str, NonFiniteTrainingError] = {}  # the SAEs stopped by NaN / inf, and why
        self.n_steps = 0  # lockstep steps taken (a stopped SAE's own n_steps is where it stopped)

    @property
    def saes(self) -> dict[str, SAE]:
        return {name: t.sae for name, t in self.trainers.items()}

    @property
    def logs(self) -> dict[str, list[dict[str, float]]]:
        """Each SAE's training log (its trainer's `log`)."""
        return {name: t.log for name, t in self.trainers.items()}

    @property
    def dead_fraction(self) -> dict[str, float]:
        return {name: t.dead_fraction for name, t in self.trainers.items()}

    def evaluate(self) -> dict[str, dict[str, float]]:
        """Each SAE's `SAETrainer.evaluate()` (needs `model` and `eval_tokens`)."""
        if any(t.model is None for t in self.trainers.values()):
            raise ValueError("MultiSAETrainer.evaluate: built without model and eval_tokens; pass both to evaluate")
        return {name: t.evaluate() for name, t in self.trainers.items()}

    def _live(self) -> dict[str, SAETrainer]:
        return {n: t for n, t in self.trainers.items() if n not in self.errors}

    def _rows(self, batch: Any, step: int) -> dict[str, Tensor]:
        """Each live SAE's rows of `batch` (a dict hook -> [n, d], or one tensor when they share one hook),
        checked for all before any SAE steps, so a bad batch leaves every SAE as it was."""
        live = self._live()
        if isinstance(batch, Tensor):
            hooks = {self.hooks[n] for n in live}
            if len(hooks) > 1:
                raise TypeError(
                    f"MultiSAETrainer: the batch of step {step} is one tensor; SAEs on hooks {sorted(hooks)} "
                    "need a dict hook -> rows"
                )
            batch = {h: batch for h in hooks}
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"MultiSAETrainer: the batch of step {step} must be a dict hook -> [batch, d] tensor, "
                f"got {type(batch).__name__}"
            )
        rows: dict[str, Tensor] = {}
        for name, t in live.items():
            hook, d_in = self.hooks[name], t.sae.cfg.d_in
            if hook not in batch:
                raise KeyError(
                    f"MultiSAETrainer: the batch of step {step} has no rows of {hook!r} (SAE {name!r}); "
                    f"it has {sorted(batch)}"
                )
            x = batch[hook]
            if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != d_in:
                shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(
                    f"MultiSAETrainer: the batch of step {step} holds {shape} for {hook!r}; SAE {name!r} expects "
                    f"[batch, d_in={d_in}]"
                )
            rows[name] = x
        n_rows = {int(x.shape[0]) for x in rows.values()}
        if len(n_rows) > 1:
            raise ValueError(
                f"MultiSAETrainer: the batch of step {step} holds {sorted(n_rows)} rows for different hooks; "
                "expected one count"
            )
        return rows

    def step(self, batch: Any) -> dict[str, dict[str, Tensor]]:
        """One step of every SAE still training on `batch`; returns each one's loss parts. An SAE that meets
        NaN / inf stops (see `SAETrainer.step`) and, once the others have stepped, `MultiTrainingError` names it."""
        parts, stopped = self._step(batch, time.perf_counter(), log=False)
        if stopped:
            raise MultiTrainingError(_stopped_words(stopped), stopped)
        return parts

    def _step(
        self, batch: Any, start: float, log: bool
    ) -> tuple[dict[str, dict[str, Tensor]], dict[str, NonFiniteTrainingError]]:
        rows = self._rows(batch, self.n_steps + 1)
        parts: dict[str, dict[str, Tensor]] = {}
        stopped: dict[str, NonFiniteTrainingError] = {}
        for name, x in rows.items():
            trainer = self.trainers[name]
            try:
                parts[name] = trainer.step(x)
            except NonFiniteTrainingError as e:
                stopped[name] = self.errors[name] = e
                continue
            if log:
                trainer.record(x, parts[name], start)
        self.n_steps += 1
        return parts, stopped

    def train(self, batches: Iterable[Any], n_steps: int, progress: bool = True) -> dict[str, list[dict[str, float]]]:
        """`n_steps` lockstep steps on `batches` (dicts hook -> `[batch, d]`, e.g. from
        `activation_batches(model, hooks, texts)`; or tensors when every SAE reads one hook), each SAE
        logged as `SAETrainer.train` logs it. Returns the logs; raises `MultiTrainingError` at the end if
        an SAE stopped on NaN / inf (the others trained to the end).

        Example:
            >>> logs = trainer.train(activation_batches(model, hooks, texts), n_steps=2000)
        """
        n_steps = check_int_in_range(n_steps, "n_steps", 1, None)
        for t in self._live().values():
            t.begin(n_steps)
        live = len(self._live())
        bar = tqdm(total=n_steps, desc=f"train {live} SAEs", unit="step", disable=not progress)
        it = iter(batches)
        start = time.perf_counter()
        try:
            for i in range(n_steps):
                if not self._live():
                    break
                batch = next(it, None)
                if batch is None:
                    raise ValueError(f"MultiSAETrainer: batches: ran out after {i} steps (n_steps asked {n_steps})")
                self._step(batch, start, log=True)
                logged = {n: t.log[-1] for n, t in self._live().items() if t.log and t.log[-1]["step"] == t.n_steps}
                if logged:
                    bar.set_postfix(
                        {k: " ".join(f"{e[k]:.3g}" for e in logged.values()) for k in ("l0", "explained_variance")}
                    )
                bar.update(1)
        finally:
            bar.close()
        for name, trainer in self._live().items():
            try:
                trainer.finish()
            except NonFiniteTrainingError as e:
                self.errors[name] = e
        if self.errors:
            raise MultiTrainingError(_stopped_words(self.errors), dict(self.errors))
        return self.logs


def _stopped_words(stopped: Mapping[str, NonFiniteTrainingError]) -> str:
    return "; ".join(f"SAE {name!r} stopped: {e}" for name, e in stopped.items())


def train_saes(
    model: Any,
    saes: Any,
    texts: Sequence[str],
    n_steps: int,
    cfg: Any = None,
    *,
    batch_size: int = 4096,
    context_size: int = 128,
    seed: int = 0,
    eval_tokens: Tensor | None = None,
    device: str | torch.device | None = None,
    keep_in_memory: bool = False,
    progress: bool = True,
) -> MultiSAETrainer:
    """Train `saes` (see `MultiSAETrainer`) for `n_steps` steps of `batch_size` rows from one pass of the
    activation store over `texts`: one forward per batch of windows serves every SAE its hook's rows.
    Returns the trainer (its `logs`, `errors`); the SAEs are trained in place.

    The data: `activation_batches(model, hooks, texts, batch_size, context_size, seed, device, keep_in_memory)`,
    the hooks in the SAEs' order. The windows and the mixing order are those of a store of one hook with the
    same seed, so each SAE sees the rows a run of its own would see, bit for bit, with one exception:
    `blocks.L.hook_resid_pre` (L >= 1) beside other hooks. A store of that hook alone computes it by the plain
    forward (fused LayerNorm and attention kernels), a store of several hooks by the cached forward's explicit
    maths (bit for bit `blocks.{L-1}.hook_resid_post`'s rows), so they differ in rounding (float32: ~1e-7
    relative). SAEs that all read one hook (N widths or architectures) are bit for bit in every case. With
    `keep_in_memory` the first pass's rows are kept (float16) for later passes, each hook's (memory: rows x the
    hooks' widths x 2 bytes); without it memory is the store's buffer and a later pass runs the model again.

    Example:
        >>> trainer = train_saes(model, [sae_resid0, sae_resid1, sae_mlp1], texts, n_steps=1000,
        ...                      cfg=SAETrainingConfig(lr=4e-4), batch_size=4096)
        >>> trainer.logs["blocks.0.hook_resid_pre-topk-1024"][-1]["l0"]
    """
    named = _named(saes)
    check_fit(model, named)
    trainer = MultiSAETrainer(named, cfg, model if eval_tokens is not None else None, eval_tokens)
    n_steps = check_int_in_range(n_steps, "n_steps", 1, None)
    hooks = list(dict.fromkeys(trainer.hooks.values()))
    where = device if device is not None else model.W_E.device
    batches = activation_batches(model, hooks, texts, batch_size, context_size, seed, where, keep_in_memory)
    trainer.train(batches, n_steps, progress)
    return trainer


# ----- the end of train-sae with several SAEs ---------------------------------------------------------------------
def save_trained_saes(
    trainer: MultiSAETrainer,
    batches: Iterable[Any],
    n_steps: int,
    out: Path,
    evaluate: Callable[[SAE], dict[str, Any]],
    fields: dict[str, Any],
    progress: bool = True,
) -> dict[str, Any]:
    """train-sae's end with several SAEs, each in its folder OUT/<name>, in the order that loses nothing:
    train them in lockstep (an SAE stopped by NaN / inf saves its last good state in OUT/<name>/last_good,
    the others go on); save each trained SAE; write each one's metrics.json without validation; evaluate
    each; write them again with it, and OUT/metrics.json (every SAE's by name); then, if an SAE stopped,
    `MultiTrainingError` names each. `fields` go into every metrics.json (validation_text, command)."""
    folders = {name: out / name for name in trainer.trainers}
    start = time.perf_counter()
    stopped: dict[str, NonFiniteTrainingError] = {}
    try:
        trainer.train(batches, n_steps, progress)
    except MultiTrainingError as error:
        stopped = error.errors
    seconds = time.perf_counter() - start
    notes = {}
    for name, e in stopped.items():
        if e.last_good_step:  # something trained worth keeping
            trainer.trainers[name].sae.save_model(folders[name] / "last_good")
            notes[name] = f"{e}; saved in {folders[name] / 'last_good'}"
        else:
            notes[name] = str(e)
    done = {n: t for n, t in trainer.trainers.items() if n not in stopped}
    metrics: dict[str, dict[str, Any]] = {}
    for name, t in done.items():
        t.sae.save_model(folders[name])  # before the evaluations, which can fail
        metrics[name] = {
            "validation": None,  # filled in below
            **fields,
            "train": {k: t.log[-1][k] for k in ("l0", "mse", "explained_variance", "dead_fraction")},
            "steps": t.n_steps,
            "train_tokens": t.n_tokens,
            "train_seconds": round(seconds, 1),  # of the lockstep run, every SAE together
            "trained_with": [n for n in trainer.trainers if n != name],
        }
        write_atomic(folders[name] / "metrics.json", json.dumps(metrics[name], indent=2) + "\n")
    saved = ", ".join(str(folders[n]) for n in done)
    where = f"train-sae: the trained SAEs are saved in {saved} (metrics.json without validation)"
    for name, t in done.items():
        try:
            metrics[name]["validation"] = evaluate(t.sae)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{where}, but the evaluation of {name!r} failed: {e}") from e
        except Exception:  # another kind (out of memory ...): its traceback follows this line
            print(where, file=sys.stderr)
            raise
        write_atomic(folders[name] / "metrics.json", json.dumps(metrics[name], indent=2) + "\n")
    summary = {"saes": metrics, "stopped": notes, "train_seconds": round(seconds, 1), **fields}
    write_atomic(out / "metrics.json", json.dumps(summary, indent=2) + "\n")
    shown = {n: {k: v for k, v in m["validation"].items() if not isinstance(v, list)} for n, m in metrics.items()}
    print(json.dumps(shown, indent=2))
    if stopped:
        raise MultiTrainingError(
            "train-sae: " + "; ".join(f"SAE {n!r} stopped: {w}" for n, w in notes.items()), stopped
        )
    return summary
