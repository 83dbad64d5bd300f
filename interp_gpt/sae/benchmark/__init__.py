"""Compare SAE architectures: every trainable architecture trained on the same data with the same budget, on
synthetic ground truth (`interp_gpt.sae.synthetic`: MCC, uniqueness, classification, shrinkage, L0, dead
latents; absorption on a planted hierarchy) and on a real hook of a model (`evaluate_sae` and SAEBench's
other core metrics), written up as a markdown table, SAEBench-shaped JSON and an offline plotly page.

    recipes.py    ARCHITECTURE_DEFAULTS: the one table of per-architecture settings (k, widths, coefficients)
    synthetic.py  SyntheticBench, synthetic_benchmark (why absorption is read on a planted hierarchy: there)
    real_hook.py  RealHookBench, real_hook_benchmark, core_metrics
    report.py     the table, the JSON (SAEBench's key names), the figure
    run.py        SAEBenchConfig, benchmark_architectures (the phases, in order)
    command.py    `interp-gpt sae-bench` / `python -m interp_gpt.sae.benchmark`

Example:
    >>> from interp_gpt.sae.benchmark import SAEBenchConfig, SyntheticBench, benchmark_architectures
    >>> results = benchmark_architectures(SAEBenchConfig(seeds=(0, 1, 2)), out="bench-out")
    >>> results["synthetic"]["runs"]["topk"][0]["mcc"]
"""

from .real_hook import RealHookBench, core_metrics, real_hook_benchmark
from .recipes import ARCHITECTURE_DEFAULTS, LEVELS, SCALE_POWERS, TARGET_L0, recipe, trainable_architectures
from .report import markdown_table, saebench_json, summarise
from .run import SAEBenchConfig, benchmark_architectures
from .synthetic import SyntheticBench, synthetic_benchmark

__all__ = [
    "benchmark_architectures",
    "SAEBenchConfig",
    "SyntheticBench",
    "RealHookBench",
    "synthetic_benchmark",
    "real_hook_benchmark",
    "core_metrics",
    "ARCHITECTURE_DEFAULTS",
    "TARGET_L0",
    "LEVELS",
    "SCALE_POWERS",
    "recipe",
    "trainable_architectures",
    "summarise",
    "markdown_table",
    "saebench_json",
]
