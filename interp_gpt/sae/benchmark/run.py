"""`benchmark_architectures`: every trainable SAE architecture (or those named) trained on the same data with
the same budget, on synthetic ground truth and on a real hook, scored, and written up.

Phases (each its own module):
  1. recipes     one table of per-architecture settings (`recipes.ARCHITECTURE_DEFAULTS`), checked, with the
                 real hook's model, hook and corpus;
  2. synthetic   per seed, every architecture on the same samples of the main synthetic model and of a
                 planted hierarchy, scored by `evaluate_synthetic` and `absorption_score`;
  3. real hook   every architecture on the same activation batches of a model's hook, scored by
                 `evaluate_sae` and SAEBench's other core metrics on held-out tokens;
  4. report      the markdown table, the SAEBench-shaped JSON and the plotly page, each written whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...checks import check_seed
from .real_hook import RealHookBench, prepare_real_hook, real_hook_benchmark
from .recipes import build, check_architectures, recipe
from .report import write_outputs
from .synthetic import SyntheticBench, synthetic_benchmark

__all__ = ["SAEBenchConfig", "benchmark_architectures"]


@dataclass
class SAEBenchConfig:
    """What to benchmark: the architectures, the seeds, the two parts (None skips one) and per-architecture
    overrides of the table (`{"standard": {"l1_coefficient": 4.0}}`).

    Example:
        >>> SAEBenchConfig(architectures=("topk", "jumprelu"), seeds=(0, 1), real=None)
    """

    architectures: Sequence[str] | None = None  # None: every trainable architecture
    seeds: Sequence[int] = (0, 1, 2)  # synthetic: one run per seed; the real hook: the first
    synthetic: SyntheticBench | None = field(default_factory=SyntheticBench)
    real: RealHookBench | None = field(default_factory=RealHookBench)
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = "SAEBenchConfig"
        self.architectures = check_architectures(self.architectures, "architectures")
        if isinstance(self.seeds, (str, bytes)) or not isinstance(self.seeds, Sequence):
            raise TypeError(f"{where}: seeds must be a list of ints, got {type(self.seeds).__name__} ({self.seeds!r})")
        if not self.seeds:
            raise ValueError(f"{where}: seeds=[]: expected at least one seed (several give the spread over seeds)")
        self.seeds = tuple(check_seed(s, f"seeds[{i}]", where) for i, s in enumerate(self.seeds))
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"{where}: seeds={list(self.seeds)} repeats a seed; each seed is one more run")
        if self.synthetic is None and self.real is None:
            raise ValueError(f"{where}: synthetic and real are both None: nothing to benchmark")
        for name, cls in (("synthetic", SyntheticBench), ("real", RealHookBench)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"{where}: {name} must be a {cls.__name__} or None, got {type(value).__name__}")
        if not isinstance(self.overrides, Mapping):
            raise TypeError(
                f"{where}: overrides must be a dict architecture -> {{field: value}}, got {self.overrides!r}"
            )
        for arch, fields in self.overrides.items():
            if arch not in self.architectures:
                raise ValueError(
                    f"{where}: overrides[{arch!r}]: {arch!r} is not benchmarked here ({', '.join(self.architectures)})"
                )
            if not isinstance(fields, Mapping):
                raise TypeError(f"{where}: overrides[{arch!r}] must be a dict field -> value, got {fields!r}")

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON (the eval_config of sae_bench.json)."""
        return {
            "architectures": list(self.architectures or ()),
            "seeds": list(self.seeds),
            "synthetic": self.synthetic.to_dict() if self.synthetic else None,
            "real": self.real.to_dict() if self.real else None,
            "overrides": {a: dict(f) for a, f in self.overrides.items()},
        }


def benchmark_architectures(
    cfg: SAEBenchConfig | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    model: Any = None,
) -> dict[str, Any]:
    """Benchmark the architectures of `cfg` (default: every trainable one, the default parts) and, with `out`,
    write OUT/sae_bench.md, OUT/sae_bench.json and OUT/sae_bench.html (see `report`). `model`: the real
    hook's model already loaded (default: `cfg.real.model`, loaded). Returns {"config", "architectures",
    "recipes", "synthetic", "real", "files"}. The example is a toy budget, synthetic only; the defaults, with
    the real hook, took 1 min 56 s with one thread on 2 shared CPU cores.

    Example:
        >>> synthetic = SyntheticBench(num_features=64, hidden_dim=32, steps=50, batch_size=256, eval_samples=2000)
        >>> cfg = SAEBenchConfig(("topk", "standard"), seeds=(0, 1), synthetic=synthetic, real=None)
        >>> results = benchmark_architectures(cfg, out="bench-out", progress=False)
        >>> print(open("bench-out/sae_bench.md").read())        # the table, one row per architecture
        >>> results["synthetic"]["runs"]["topk"][1]["mcc"]       # seed 1's score
    """
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    cfg = SAEBenchConfig() if cfg is None else cfg
    if not isinstance(cfg, SAEBenchConfig):
        raise TypeError(f"cfg must be a SAEBenchConfig, got {type(cfg).__name__}")
    folder = None if out is None else Path(out)
    if folder is not None and folder.exists() and not folder.is_dir():
        raise ValueError(f"out={str(out)!r} is a file; expected a folder (it gets sae_bench.md, .json, .html)")
    # Phase 1: the settings of every architecture and the real hook's model and data, checked before any training
    architectures = tuple(cfg.architectures or ())
    recipes = {a: recipe(a, cfg.overrides.get(a)) for a in architectures}
    prepared = prepare_real_hook(cfg.real, model) if cfg.real else None
    for a, r in recipes.items():  # each SAE built once at the run's shapes: a bad setting is refused now
        if (syn := cfg.synthetic) is not None:
            d_sae, n = syn.d_sae or syn.num_features, syn.planted_features
            build(a, r, syn.hidden_dim, d_sae, syn.target_l0 or 1, 1.0, "synthetic", {}, "synthetic")
            build(a, r, n, n, 1, 1.0, "synthetic", {}, "planted hierarchy")
        if cfg.real is not None and prepared is not None:
            build(a, r, prepared.d_in, cfg.real.d_sae, cfg.real.target_l0, 1.0, cfg.real.hook, {}, "real hook")
    steps = (2 * len(cfg.seeds) * cfg.synthetic.steps if cfg.synthetic else 0) + (cfg.real.steps if cfg.real else 0)
    results: dict[str, Any] = {"config": cfg.to_dict(), "architectures": list(architectures), "recipes": recipes}
    with tqdm(total=steps, desc="sae-bench", unit="step", disable=not progress) as bar:
        # Phase 2: synthetic ground truth
        results["synthetic"] = synthetic_benchmark(cfg.synthetic, recipes, cfg.seeds, bar) if cfg.synthetic else None
        # Phase 3: a real hook
        results["real"] = real_hook_benchmark(cfg.real, recipes, cfg.seeds[0], bar, prepared) if cfg.real else None
        bar.set_description("sae-bench: done")
    # Phase 4: the report
    results["files"] = {k: str(p) for k, p in write_outputs(folder, results).items()} if folder else {}
    return results
