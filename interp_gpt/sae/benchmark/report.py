"""The benchmark's outputs: a summary per architecture (means and spreads over seeds), the markdown table,
the SAEBench-shaped JSON and the plotly figure, each written whole into the output folder.

The JSON holds one entry per architecture in SAEBench's eval-output layout (`sae_bench.evals.core`'s
`CoreEvalOutput`: eval_type_id, eval_config, eval_id, datetime_epoch_millis, eval_result_metrics,
eval_result_details, eval_result_unstructured, sae_bench_commit_hash, sae_lens_id, sae_lens_release_id,
sae_lens_version, sae_cfg_dict). Its eval_result_metrics has SAEBench's core categories with their key names
(model_behavior_preservation, model_performance_preservation, reconstruction_quality, shrinkage, sparsity,
token_stats, misc_metrics) from the real hook, and two of ours: `synthetic_ground_truth` (the synthetic
scores, mean and `_std` over seeds) and `absorption` (`mean_full_absorption_score`: SAEBench's name for the
share of events where the parent's latent is silent and a child's fires, here on the planted hierarchy).
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...files import atomic_path, write_atomic
from ...plots.page import save_html

__all__ = [
    "SYNTHETIC_KEYS",
    "summarise",
    "markdown_table",
    "saebench_json",
    "figure",
    "finite",
    "write_outputs",
    "FILES",
]

# The synthetic scores averaged over seeds (evaluate_synthetic's keys, classification flattened).
SYNTHETIC_KEYS = ("mcc", "uniqueness", "precision", "recall", "f1_score", "accuracy", "shrinkage", "sae_l0",
                  "true_l0", "dead_latents", "explained_variance", "absorption", "absorption_main_model",
                  "planted_sae_l0")  # fmt: skip
FILES = {"table": "sae_bench.md", "json": "sae_bench.json", "figure": "sae_bench.html", "png": "sae_bench.png"}


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per architecture: each synthetic score's mean and `_std` over the seeds that trained (with
    `seeds_ok` / `errors`), and the real hook's metrics, from `benchmark_architectures`' results."""
    out: dict[str, dict[str, Any]] = {}
    for arch in results["architectures"]:
        row: dict[str, Any] = {"errors": []}
        if results.get("synthetic"):
            per_seed = results["synthetic"]["runs"][arch]
            ok = [r for r in per_seed if "error" not in r]
            row["errors"] += [f"synthetic seed {r['seed']}: {r['error']}" for r in per_seed if "error" in r]
            row["seeds_ok"] = len(ok)
            for key in SYNTHETIC_KEYS:
                row[key], row[f"{key}_std"] = _mean_std([r[key] for r in ok])
        if results.get("real"):
            real = results["real"]["runs"][arch]
            if "error" in real:
                row["errors"].append(f"real hook: {real['error']}")
            else:
                row["real"] = real
        out[arch] = row
    return out


def _cell(value: Any, digits: int = 3, std: Any = None) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "—"
    text = f"{value:.{digits}f}"
    return f"{text} ± {std:.{digits}f}" if isinstance(std, (int, float)) and math.isfinite(std) else text


def markdown_table(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> str:
    """The table: one row per architecture, the synthetic scores (mean ± std over seeds) then the real
    hook's metrics; a line below says what was run."""
    syn, real = results.get("synthetic"), results.get("real")
    head, rule = ["architecture"], ["---"]
    if syn:
        head += ["MCC", "uniqueness", "F1", "shrinkage", "L0", "dead", "absorption"]
    if real:
        head += ["EV", "CE recovered", "KL", "L0 (hook)", "dead (hook)", "dense (hook)"]
    rule += ["---:"] * (len(head) - 1)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(rule) + " |"]
    for arch, row in summary.items():
        cells = [arch]
        if syn:
            cells += [_cell(row["mcc"], 3, row["mcc_std"]), _cell(row["uniqueness"]), _cell(row["f1_score"]),
                      _cell(row["shrinkage"]), _cell(row["sae_l0"], 2), _cell(row["dead_latents"], 1),
                      _cell(row["absorption"], 3, row["absorption_std"])]  # fmt: skip
        if real:
            r = row.get("real", {})
            cells += [_cell(r.get("explained_variance")), _cell(r.get("ce_loss_recovered")), _cell(r.get("kl_div")),
                      _cell(r.get("l0"), 1), _cell(r.get("dead_fraction")), _cell(r.get("dense_fraction"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    if syn:
        c, m, p = results["config"]["synthetic"], syn["main"], syn["planted"]
        notes.append(
            f"Synthetic: {c['num_features']} true features in {c['hidden_dim']} dimensions (hierarchy, correlations; "
            f"true L0 {m['true_l0']:.2f}, target {m['target_l0']}), d_sae {m['d_sae']}, {c['steps']} steps of "
            f"{c['batch_size']}, lr {c['lr']:g}, seeds {results['config']['seeds']} (mean ± std); dead = latents "
            f"never firing on {c['eval_samples']} samples. Absorption on a planted hierarchy ({p['num_features']} "
            f"orthonormal features, true L0 {p['true_l0']:.2f}, target {p['target_l0']}), trained the same way."
        )
    if real:
        c, h = results["config"]["real"], real["hook"]
        notes.append(
            f"Real hook: {c['model']} {c['hook']}, d_sae {c['d_sae']}, target L0 {c['target_l0']}, {h['steps']} steps "
            f"of {c['batch_size']} tokens, lr {c['lr']:g}, seed {results['config']['seeds'][0]}; scored on "
            f"{h['eval_tokens']} held-out tokens (dead / dense: shares of latents)."
        )
    errors = [f"{arch}: {e}" for arch, row in summary.items() for e in row["errors"]]
    notes += [f"Stopped: {e}" for e in errors]
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"


def _core(real: dict[str, Any], hook: dict[str, Any]) -> dict[str, dict[str, float]]:
    """SAEBench's core categories from our metrics (its key names)."""
    kl_ab, kl_sae = hook["kl_div_with_ablation"], real["kl_div"]
    return {
        "model_behavior_preservation": {
            "kl_div_score": (kl_ab - kl_sae) / kl_ab if kl_ab else math.nan,
            "kl_div_with_ablation": kl_ab,
            "kl_div_with_sae": kl_sae,
        },  # fmt: skip
        "model_performance_preservation": {
            "ce_loss_score": real["ce_loss_recovered"],
            "ce_loss_with_ablation": real["ce_zero_ablation"],
            "ce_loss_with_sae": real["ce_spliced"],
            "ce_loss_without_sae": real["ce_clean"],
        },  # fmt: skip
        "reconstruction_quality": {
            "explained_variance": real["explained_variance"],
            "mse": real["mse"],
            "cossim": real["cossim"],
        },  # fmt: skip
        "shrinkage": {k: real[k] for k in ("l2_norm_in", "l2_norm_out", "l2_ratio", "relative_reconstruction_bias")},
        "sparsity": {"l0": real["l0"], "l1": real["l1"]},
        "token_stats": {
            "total_tokens_eval_reconstruction": hook["eval_tokens"],
            "total_tokens_eval_sparsity_variance": hook["eval_tokens"],
        },  # fmt: skip
        "misc_metrics": {
            k: real[k]
            for k in (
                "frac_alive",
                "freq_over_1_percent",
                "freq_over_10_percent",
                "average_max_decoder_cosine_sim",
                "average_max_encoder_cosine_sim",
            )
            if k in real
        },  # fmt: skip
    }


def saebench_json(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON written to sae_bench.json (see the module's docstring)."""
    from ... import __version__

    eval_id, stamp = str(uuid.uuid4()), int(time.time() * 1000)
    syn, real = results.get("synthetic"), results.get("real")
    per_arch: dict[str, Any] = {}
    for arch, row in summary.items():
        metrics: dict[str, Any] = {}
        if real and "real" in row:
            metrics.update(_core(row["real"], real["hook"]))
        if syn and row["seeds_ok"]:
            keys = [k for k in SYNTHETIC_KEYS if not k.startswith(("absorption", "planted"))]
            stds = {f"{k}_std": row[f"{k}_std"] for k in keys}
            metrics["synthetic_ground_truth"] = {**{k: row[k] for k in keys}, **stds, "n_seeds": row["seeds_ok"]}
            metrics["absorption"] = {
                "mean_full_absorption_score": row["absorption"], "std_dev_full_absorption_score": row["absorption_std"],
                "mean_full_absorption_score_main_model": row["absorption_main_model"],
                "std_dev_full_absorption_score_main_model": row["absorption_main_model_std"],
                "planted_sae_l0": row["planted_sae_l0"], "planted_true_l0": syn["planted"]["true_l0"],
                "n_seeds": row["seeds_ok"],
            }  # fmt: skip
        per_arch[arch] = {
            "eval_type_id": "core",
            "eval_config": results["config"],
            "eval_id": eval_id,
            "datetime_epoch_millis": stamp,
            "eval_result_metrics": metrics,
            "eval_result_details": [],
            "eval_result_unstructured": {
                "synthetic_per_seed": syn["runs"][arch] if syn else None,
                "real_hook": real["runs"][arch] if real else None,
                "errors": row["errors"],
            },
            "sae_bench_commit_hash": None,
            "sae_lens_id": None,
            "sae_lens_release_id": None,
            "sae_lens_version": None,
            "sae_cfg_dict": real["saes"][arch].cfg.to_dict() if real and arch in real["saes"] else None,
        }
    return {
        "eval_type_id": "interp_gpt_sae_bench",
        "eval_id": eval_id,
        "datetime_epoch_millis": stamp,
        "interp_gpt_version": __version__,
        "eval_config": results["config"],
        "synthetic": {k: v for k, v in syn.items() if k not in ("runs", "saes")} if syn else None,
        "real_hook": real["hook"] if real else None,
        "architectures": per_arch,
    }


def figure(results: dict[str, Any], summary: dict[str, dict[str, Any]]) -> go.Figure:
    """MCC against L0 on the synthetic data (error bars: std over seeds), absorption on the planted hierarchy,
    and explained variance against L0 on the real hook; one colour per architecture."""
    syn, real = results.get("synthetic"), results.get("real")
    titles = [t for t, on in (("synthetic: MCC vs L0", syn), ("planted hierarchy: absorption", syn),
                              ("real hook: explained variance vs L0", real)) if on]  # fmt: skip
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
    for i, (arch, row) in enumerate(summary.items()):
        colour = palette[i % len(palette)]
        col = 1
        if syn:
            fig.add_trace(go.Scatter(x=[row["sae_l0"]], y=[row["mcc"]], name=arch, legendgroup=arch, mode="markers",
                                     marker={"color": colour, "size": 11},
                                     error_x={"array": [row["sae_l0_std"]]}, error_y={"array": [row["mcc_std"]]}),
                          row=1, col=1)  # fmt: skip
            fig.add_trace(go.Bar(x=[arch], y=[row["absorption"]], name=arch, legendgroup=arch, showlegend=False,
                                 marker={"color": colour}, error_y={"array": [row["absorption_std"]]}),
                          row=1, col=2)  # fmt: skip
            col = 3
        if real and "real" in row:
            r = row["real"]
            fig.add_trace(go.Scatter(x=[r["l0"]], y=[r["explained_variance"]], name=arch, legendgroup=arch,
                                     mode="markers", marker={"color": colour, "size": 11, "symbol": "diamond"},
                                     showlegend=not syn), row=1, col=col)  # fmt: skip
    if syn:
        fig.update_xaxes(title_text="L0 (active latents per sample)", row=1, col=1)
        fig.update_yaxes(title_text="MCC", row=1, col=1)
        fig.update_yaxes(title_text="absorption", row=1, col=2)
    if real:
        fig.update_xaxes(title_text="L0 (active latents per token)", row=1, col=len(titles))
        fig.update_yaxes(title_text="explained variance", row=1, col=len(titles))
    fig.update_layout(title="SAE architectures: ground truth and a real hook", width=420 * len(titles), height=460,
                      template="plotly_white")  # fmt: skip
    return fig


def finite(value: Any) -> Any:
    """`value` with every NaN / inf float replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def write_outputs(out: Path, results: dict[str, Any]) -> dict[str, Path]:
    """Write the table, the JSON and the figure (and a PNG where kaleido can draw one) into `out`, each whole
    or not at all; returns {kind: path}."""
    import importlib.util
    import json

    summary = summarise(results)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "table": write_atomic(out / FILES["table"], markdown_table(results, summary)),
        "json": write_atomic(out / FILES["json"], json.dumps(finite(saebench_json(results, summary)), indent=2) + "\n"),
    }
    fig = figure(results, summary)
    paths["figure"] = save_html(fig, out / FILES["figure"])
    if importlib.util.find_spec("kaleido") is not None:
        try:
            with atomic_path(out / FILES["png"]) as tmp:
                fig.write_image(str(tmp), format="png")
            paths["png"] = out / FILES["png"]
        except Exception:  # noqa: BLE001 (kaleido without a browser to draw with: the PNG is optional)
            pass
    return paths
