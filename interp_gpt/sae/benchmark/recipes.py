"""The one table the benchmark trains every architecture by (`ARCHITECTURE_DEFAULTS`), how a row of it
becomes an SAE and a training config at a given target L0 and activation scale (`build`), and the training
of every architecture on the same batches (`train_together`) into the form a user deploys (`deployed`).

A row holds SAEConfig fields and SAETrainingConfig fields by name. `TARGET_L0` stands for the run's target
L0 (the synthetic data's true L0, or the real hook's `--k`), so the topk family keeps that many features and
matching pursuit picks that many; `LEVELS` gives Matryoshka the nested widths d_sae/8, d_sae/4, d_sae/2,
d_sae. The coefficients are stated for activations normalised as sae-lens' `expected_average_only_in` does
(E||x|| = sqrt(d_in)); the trainer sees the raw activations, so each is converted by the measured scale
`u = E||x|| / sqrt(d_in)` to the power in `SCALE_POWERS` (an L1 term grows with the activations: x u; an L0
term does not, beside an MSE that grows as u^2: x u^2; a threshold or bandwidth is an activation: x u).
A field a row does not set keeps the trainer's default, as it is (not converted). The coefficients were chosen
on the two default runs (synthetic: true L0 2.9; tiny-gpt2's blocks.1.hook_resid_pre: target 8) to land near the
target L0 on both; an L1 or tanh penalty's L0 depends on the data more than the scale accounts for, so those
land within about 2x of it (the table reports every SAE's L0 beside its scores; change a value with --set).

An architecture the table does not name (one merged later) trains with its own defaults, with `TARGET_L0`
for a `k` or `max_iterations` it owns and `LEVELS` for `matryoshka_widths`.

Example:
    >>> recipe("topk")
    {'k': 'target_l0'}
    >>> sae, cfg = build("jumprelu", recipe("jumprelu"), d_in=64, d_sae=256, target_l0=4, scale=0.5,
    ...                  hook_name="synthetic", training={"lr": 3e-3})
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..saes.architectures import REGISTRY
from ..saes.config import SAEConfig, SAEMetadata
from ..saes.core import SAE
from ..training.multi import MultiSAETrainer, MultiTrainingError
from ..training.sae_trainer import SAETrainingConfig

__all__ = [
    "TARGET_L0",
    "LEVELS",
    "ARCHITECTURE_DEFAULTS",
    "SCALE_POWERS",
    "trainable_architectures",
    "check_architectures",
    "recipe",
    "build",
    "activation_scale",
    "parse_override",
    "train_together",
    "deployed",
    "init_seed",
]

TARGET_L0 = "target_l0"  # the run's target L0 (an int >= 1)
LEVELS = "levels"  # Matryoshka's nested widths: d_sae // 8, // 4, // 2, d_sae (distinct, >= 1)

# architecture -> its settings (SAEConfig or SAETrainingConfig fields), coefficients in sae-lens' normalised units.
ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "standard": {"l1_coefficient": 5.0},
    "topk": {"k": TARGET_L0},
    "abstopk": {"k": TARGET_L0},
    "batchtopk": {"k": TARGET_L0},
    "matryoshka_batchtopk": {"k": TARGET_L0, "matryoshka_widths": LEVELS},
    "gated": {"l1_coefficient": 6.0},
    # sae-lens' tanh sparsity loss (Anthropic's): its default "step" loss moves each threshold by at most lr a
    # step (Adam), too slowly to reach a sparse code within a benchmark's budget.
    "jumprelu": {"jumprelu_sparsity_loss_mode": "tanh", "l0_coefficient": 1.5},
    "matching_pursuit": {"max_iterations": TARGET_L0},
}

# field -> the power of the activation scale u its normalised value is multiplied by
SCALE_POWERS: dict[str, int] = {
    "l1_coefficient": 1,
    "l0_coefficient": 2,
    "pre_act_loss_coefficient": 1,
    "jumprelu_init_threshold": 1,
    "jumprelu_bandwidth": 1,
    "jumprelu_tanh_scale": -1,
    "residual_threshold": 1,
}
_FALLBACK = {"k": TARGET_L0, "max_iterations": TARGET_L0, "matryoshka_widths": LEVELS}
_SAE_FIELDS = {f.name for f in dataclasses.fields(SAEConfig)}
_TRAINING_FIELDS = {f.name for f in dataclasses.fields(SAETrainingConfig)} - {"history"}
_RUN_FIELDS = ("lr", "seed", "log_every")  # the run sets these: the same for every architecture


def trainable_architectures() -> tuple[str, ...]:
    """Every architecture the trainer trains, in the registry's order."""
    return tuple(name for name, arch in REGISTRY.items() if arch.trainable)


def check_architectures(names: Any, arg: str = "architectures") -> tuple[str, ...]:
    """`names` (None: every trainable architecture) checked: known, trainable, each once."""
    if names is None:
        return trainable_architectures()
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"{arg} must be a list of architecture names, got {type(names).__name__} ({names!r})")
    if not names:
        raise ValueError(f"{arg}: expected at least one architecture, got none")
    trainable = trainable_architectures()
    for name in names:
        if name not in REGISTRY:
            close = difflib.get_close_matches(str(name), list(REGISTRY), n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"{arg}: {name!r} is not an architecture{hint}; trainable: {', '.join(trainable)}")
        if name not in trainable:
            raise ValueError(
                f"{arg}: {name!r} is inference only (nothing trains it); trainable: {', '.join(trainable)}"
            )
    if twice := sorted({n for i, n in enumerate(names) if n in names[:i]}):
        raise ValueError(f"{arg}: {', '.join(map(repr, twice))} given twice; each architecture is one row")
    return tuple(names)


def recipe(architecture: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings `architecture` trains with: its row of `ARCHITECTURE_DEFAULTS` (or the fallback for its
    own `k`, `max_iterations`, `matryoshka_widths`), then `overrides` (field -> value), each field checked to be
    an SAEConfig field the architecture owns or an SAETrainingConfig field the run does not set itself."""
    arch = REGISTRY[architecture]
    row = dict(ARCHITECTURE_DEFAULTS.get(architecture, {f: v for f, v in _FALLBACK.items() if f in arch.fields}))
    for name, value in (overrides or {}).items():
        if name in _RUN_FIELDS:
            raise ValueError(f"overrides[{architecture!r}]: {name!r} is the run's own, the same for every architecture")
        if name in _SAE_FIELDS and name not in arch.fields:
            owns = f"its own fields are {', '.join(arch.fields)}" if arch.fields else "it owns no config fields"
            raise ValueError(f"overrides[{architecture!r}]: {name!r} is not a {architecture} SAE's field ({owns})")
        if name not in _SAE_FIELDS and name not in _TRAINING_FIELDS:
            close = difflib.get_close_matches(name, sorted(_TRAINING_FIELDS | set(arch.fields)), n=2)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ValueError(
                f"overrides[{architecture!r}]: {name!r} is neither an SAEConfig nor an SAETrainingConfig field{hint}"
            )
        row[name] = value
    return row


def _levels(d_sae: int) -> list[int]:
    return sorted({max(1, d_sae // 8), max(1, d_sae // 4), max(1, d_sae // 2), d_sae})


def build(
    architecture: str,
    settings: Mapping[str, Any],
    d_in: int,
    d_sae: int,
    target_l0: int,
    scale: float,
    hook_name: str,
    training: Mapping[str, Any],
    where: str = "",
) -> tuple[SAE, SAETrainingConfig]:
    """(the SAE, its training config) for one architecture: `settings` (from `recipe`) resolved at `target_l0`
    and `d_sae`, its coefficients converted by `scale` (see the module's docstring); `training` holds the
    run's shared fields (lr, seed, ...); `where` names the run in an error ("planted hierarchy")."""
    sae_fields: dict[str, Any] = {}
    train_fields: dict[str, Any] = dict(training)
    for name, value in settings.items():
        if value == TARGET_L0:
            value = target_l0
        elif value == LEVELS:
            value = _levels(d_sae)
        elif name in SCALE_POWERS and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value) * scale ** SCALE_POWERS[name]
        (sae_fields if name in _SAE_FIELDS else train_fields)[name] = value
    try:
        metadata = SAEMetadata(hook_name=hook_name)
        sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=architecture, metadata=metadata, **sae_fields))
        cfg = SAETrainingConfig(**train_fields)
    except (TypeError, ValueError) as e:
        run = f" ({where}, d_sae={d_sae})" if where else ""
        raise type(e)(f"{architecture}{run}: {e}") from None
    return sae, cfg


@torch.no_grad()
def activation_scale(x: Tensor) -> float:
    """`E||x|| / sqrt(d_in)` of rows `[n, d_in]`: 1 for activations normalised as sae-lens'
    `expected_average_only_in` leaves them."""
    scale = float(x.float().norm(dim=-1).mean()) / math.sqrt(x.shape[-1])
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"the activations' mean norm is {scale * math.sqrt(x.shape[-1])!r}: nothing to train on")
    return scale


def parse_override(text: str, arg: str = "--set") -> tuple[str, str, Any]:
    """`ARCHITECTURE.FIELD=VALUE` as (architecture, field, value); the value read as JSON where it parses
    (`8`, `1.5`, `true`, `[16, 64]`), else as a string (`tanh`).

    Example:
        >>> parse_override("topk.k=8")
        ('topk', 'k', 8)
    """
    import json

    head, sep, raw = text.partition("=")
    arch, dot, field = head.strip().partition(".")
    if not sep or not dot or not arch or not field.strip() or not raw.strip():
        raise ValueError(f"{arg}={text!r}: expected ARCHITECTURE.FIELD=VALUE, e.g. standard.l1_coefficient=4")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw.strip()
    return arch, field.strip(), value


def init_seed(seed: int) -> int:
    """The SAEs' initialisation seed for the run's `seed`, mixed so that it never equals a small seed: an
    SAE's initial decoder and a synthetic dictionary both draw `torch.randn(d_sae, d_in)`, and with one seed
    for both (0 and 0) the SAE would start at the true features."""
    return (seed * 0x9E3779B1 + 0x7F4A7C15) % 2**31


def _counted(batches: Iterable[Tensor], bar: Any) -> Iterator[Tensor]:
    for x in batches:
        bar.update(1)  # counted when handed out: the trainer takes no batch after its last step's
        yield x


def train_together(
    built: Mapping[str, tuple[SAE, SAETrainingConfig]], batches: Iterable[Tensor], steps: int, bar: Any
) -> dict[str, str]:
    """Train every SAE of `built` (architecture -> (SAE, config)) in lockstep on the same `steps` batches
    (`MultiSAETrainer`), `bar` (a tqdm) counting the steps. Returns {architecture: why it stopped} for each
    SAE stopped by NaN / inf (the others train to the end)."""
    trainer = MultiSAETrainer({name: sae for name, (sae, _) in built.items()}, {n: c for n, (_, c) in built.items()})
    try:
        trainer.train(_counted(batches, bar), steps, progress=False)
    except MultiTrainingError as e:
        return {name: str(error) for name, error in e.errors.items()}
    return {}


def deployed(sae: SAE) -> SAE:
    """The SAE as a user gets it from `save_model` and `SAE.from_pretrained`: sae-lens' inference form (a
    BatchTopK SAE becomes the JumpReLU SAE of its learned threshold; a rescaled TopK folds its decoder norms)."""
    with tempfile.TemporaryDirectory(prefix="sae-bench-") as folder:
        sae.save_model(Path(folder) / "sae")
        return SAE.from_pretrained(Path(folder) / "sae")
