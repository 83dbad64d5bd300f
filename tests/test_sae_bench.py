"""The SAE architecture benchmark (`interp_gpt.sae.benchmark`, `interp-gpt sae-bench`): the command writes the
table, the SAEBench-shaped JSON and the offline page, one row per architecture asked for; its numbers are sane
(training beats no training on ground truth; the real-hook metrics are in range and agree with `evaluate_sae`);
no SAE starts at the synthetic dictionary; bad input is refused by name before anything trains."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from interp_gpt.cli import main as cli_main
from interp_gpt.loading import from_pretrained
from interp_gpt.sae.benchmark import (
    ARCHITECTURE_DEFAULTS,
    RealHookBench,
    SAEBenchConfig,
    SyntheticBench,
    benchmark_architectures,
    recipe,
    synthetic_benchmark,
    trainable_architectures,
)
from interp_gpt.sae.benchmark.real_hook import prepare_real_hook
from interp_gpt.sae.benchmark.recipes import build, init_seed, parse_override
from interp_gpt.sae.saes.architectures import REGISTRY
from interp_gpt.sae.synthetic import evaluate_synthetic
from interp_gpt.sae.training import SAETrainer, evaluate_sae

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"
TINY_SYNTHETIC = ["--num-features", "32", "--hidden-dim", "16", "--synthetic-steps", "20",
                  "--synthetic-batch-size", "128", "--eval-samples", "1000"]  # fmt: skip
TINY_REAL = ["--n-tokens", "1024", "--batch-size", "256", "--d-sae", "32", "--k", "4", "--val-windows", "2",
             "--context-size", "32"]  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: small matrices run faster on one thread)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small corpus: the first 24k characters of the shipped Shakespeare."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(CORPUS.read_text(encoding="utf-8")[:24_000], encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["sae-bench", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def table_rows(markdown: str) -> list[list[str]]:
    """The cells of the table's body rows (after the header and the rule)."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


# ----------------------------------------------------------------------------
# the command's files
# ----------------------------------------------------------------------------
def test_the_command_writes_the_table_json_and_page_one_row_per_architecture(capsys, tmp_path, text):
    out = tmp_path / "bench"
    rc, stdout, err = run(capsys, "--out", str(out), "--architecture", "topk", "standard", "--seeds", "2",
                          "--data", str(text), *TINY_SYNTHETIC, *TINY_REAL)  # fmt: skip
    assert rc == 0, err
    assert "sae-bench" in err  # the progress bar
    markdown = (out / "sae_bench.md").read_text()
    assert markdown in stdout  # printed too
    header = markdown.splitlines()[0]
    for column in ("MCC", "uniqueness", "F1", "shrinkage", "absorption", "EV", "CE recovered", "KL", "dense (hook)"):
        assert f" {column} |" in header, column
    rows = table_rows(markdown)
    assert [r[0] for r in rows] == ["topk", "standard"]
    assert all(len(r) == len(header.strip("|").split("|")) for r in rows)
    assert " ± " in rows[0][1]  # MCC: mean ± std over the two seeds

    doc = json.loads((out / "sae_bench.json").read_text())
    assert {"eval_type_id", "eval_id", "datetime_epoch_millis", "eval_config", "synthetic", "real_hook",
            "architectures"} <= set(doc)  # fmt: skip
    assert list(doc["architectures"]) == ["topk", "standard"]
    for entry in doc["architectures"].values():
        assert {
            "eval_type_id",
            "eval_config",
            "eval_id",
            "datetime_epoch_millis",
            "eval_result_metrics",
            "eval_result_details",
            "eval_result_unstructured",
            "sae_bench_commit_hash",
            "sae_lens_id",
            "sae_lens_release_id",
            "sae_lens_version",
            "sae_cfg_dict",
        } == set(entry)  # SAEBench's envelope
        m = entry["eval_result_metrics"]
        assert {"kl_div_score", "kl_div_with_ablation", "kl_div_with_sae"} == set(m["model_behavior_preservation"])
        assert {"ce_loss_score", "ce_loss_with_ablation", "ce_loss_with_sae", "ce_loss_without_sae"} == set(
            m["model_performance_preservation"]
        )
        assert {"explained_variance", "mse", "cossim"} == set(m["reconstruction_quality"])
        assert {"l2_norm_in", "l2_norm_out", "l2_ratio", "relative_reconstruction_bias"} == set(m["shrinkage"])
        assert {"l0", "l1"} == set(m["sparsity"])
        assert {"frac_alive", "freq_over_1_percent", "freq_over_10_percent"} <= set(m["misc_metrics"])
        assert {"mcc", "mcc_std", "uniqueness", "f1_score", "shrinkage", "sae_l0", "dead_latents"} <= set(
            m["synthetic_ground_truth"]
        )
        assert m["synthetic_ground_truth"]["n_seeds"] == 2
        assert {"mean_full_absorption_score", "std_dev_full_absorption_score"} <= set(m["absorption"])
        assert len(entry["eval_result_unstructured"]["synthetic_per_seed"]) == 2
        assert entry["sae_cfg_dict"]["d_sae"] == 32
    assert doc["architectures"]["topk"]["eval_result_metrics"]["sparsity"]["l0"] == pytest.approx(4.0)

    page = (out / "sae_bench.html").read_text()
    assert "Content-Security-Policy" in page and "<script src" not in page  # self-contained, offline
    assert "MCC vs L0" in page and "absorption" in page


def test_every_option_says_its_default_in_help(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "examples:" in out and "interp-gpt sae-bench --out bench-out" in out
    block = out.split("\noptions:\n", 1)[1].split("\nexamples:", 1)[0]
    entries = [" ".join(e.split()) for e in re.split(r"\n  (?=-)", "\n" + block) if e.strip().startswith("-")]
    assert len(entries) > 20
    missing = [e for e in entries if not e.startswith("-h") and "default" not in e and "(required)" not in e]
    assert missing == []
    assert "(default: 500)" in " ".join(entries) and "(default: tiny-gpt2)" in " ".join(entries)


def test_a_part_can_be_skipped(capsys, tmp_path, text):
    out = tmp_path / "bench"
    rc, _, err = run(capsys, "--out", str(out), "--architecture", "abstopk", "--seeds", "1", "--no-real",
                     *TINY_SYNTHETIC, "--no-progress")  # fmt: skip
    assert rc == 0, err
    header = (out / "sae_bench.md").read_text().splitlines()[0]
    assert "MCC" in header and "EV" not in header
    doc = json.loads((out / "sae_bench.json").read_text())
    assert doc["real_hook"] is None
    assert set(doc["architectures"]["abstopk"]["eval_result_metrics"]) == {"synthetic_ground_truth", "absorption"}


# ----------------------------------------------------------------------------
# sane numbers
# ----------------------------------------------------------------------------
SMALL = {"num_features": 32, "hidden_dim": 16, "batch_size": 256, "lr": 1e-2,
         "eval_samples": 2000, "planted_parents": 2, "planted_free": 4}  # fmt: skip


@pytest.mark.parametrize("arch", ["topk", "gated"])
def test_training_longer_recovers_the_true_features_better_than_no_training(arch):
    recipes = {arch: recipe(arch)}
    short = synthetic_benchmark(SyntheticBench(steps=1, **SMALL), recipes, seeds=[0])["runs"][arch][0]
    long = synthetic_benchmark(SyntheticBench(steps=300, **SMALL), recipes, seeds=[0])["runs"][arch][0]
    assert long["mcc"] > short["mcc"] + 0.1, (short["mcc"], long["mcc"])
    assert long["explained_variance"] > short["explained_variance"] + 0.25
    assert 0 <= long["absorption"] <= 1 and 0 <= long["uniqueness"] <= 1


def test_no_sae_starts_at_the_synthetic_dictionary():
    """The SAE's initial decoder and the dictionary both draw randn(d_sae, d_in): with the same seed (0 and 0)
    the SAE would start at the answer. The benchmark mixes the run's seed first (`init_seed`)."""
    bench = SyntheticBench(**SMALL)
    model = bench.main_model()

    def initial_mcc(seed: int) -> float:
        sae, cfg = build("topk", recipe("topk"), 16, 32, 2, 1.0, "synthetic", {"seed": seed})
        SAETrainer(sae, cfg).default_init(model.sample(8, seed=0))
        return float(evaluate_synthetic(sae, model, n_samples=100)["mcc"])

    assert initial_mcc(bench.model_seed) > 0.99  # what the mixing avoids
    for seed in (0, 1, bench.model_seed):
        assert initial_mcc(init_seed(seed)) < 0.6, seed


def test_the_real_hook_metrics_are_evaluate_sae_s_on_the_deployed_sae_and_in_range(text, tmp_path):
    model = from_pretrained("tiny-gpt2")
    real = RealHookBench(data=(str(text),), n_tokens=2048, batch_size=256, d_sae=32, target_l0=4, val_windows=2,
                         context_size=32)  # fmt: skip
    cfg = SAEBenchConfig(architectures=["topk", "gated"], seeds=[3], synthetic=None, real=real)
    results = benchmark_architectures(cfg, tmp_path / "b", progress=False, model=model)
    assert results["synthetic"] is None
    hook = results["real"]["hook"]
    assert hook["steps"] == 8 and hook["eval_tokens"] == 64 and hook["kl_div_with_ablation"] > 0
    val_tokens = prepare_real_hook(real, model).val_tokens
    for arch, r in results["real"]["runs"].items():
        assert evaluate_sae(model, results["real"]["saes"][arch], val_tokens) == pytest.approx(
            {k: r[k] for k in evaluate_sae(model, results["real"]["saes"][arch], val_tokens)}
        )
        assert 0 <= r["dead_fraction"] <= 1 and 0 <= r["dense_fraction"] <= 1 and 0 <= r["l0"] <= 32, arch
        assert r["frac_alive"] == pytest.approx(1 - r["dead_fraction"])
        assert r["freq_over_10_percent"] == pytest.approx(r["dense_fraction"])
        assert -1 <= r["cossim"] <= 1 and r["l1"] >= 0 and math.isfinite(r["ce_loss_recovered"]), arch
    assert results["real"]["runs"]["topk"]["l0"] == pytest.approx(4.0)
    rows = table_rows((tmp_path / "b" / "sae_bench.md").read_text())
    assert rows[0][:2] == ["topk", f"{results['real']['runs']['topk']['explained_variance']:.3f}"]
    # lockstep training is training alone: the topk SAE trained without the gated one scores the same
    alone = benchmark_architectures(SAEBenchConfig(["topk"], [3], None, real), progress=False, model=model)
    assert alone["real"]["runs"]["topk"]["explained_variance"] == results["real"]["runs"]["topk"]["explained_variance"]


# ----------------------------------------------------------------------------
# the table of settings
# ----------------------------------------------------------------------------
def test_every_trainable_architecture_builds_from_the_table_at_the_target_l0():
    for arch in trainable_architectures():
        sae, cfg = build(arch, recipe(arch), 16, 64, 5, 0.5, "synthetic", {"lr": 1e-3})
        assert sae.cfg.architecture == arch
        for name in ("k", "max_iterations"):
            if name in REGISTRY[arch].fields:
                assert getattr(sae.cfg, name) == 5, (arch, name)
        if "matryoshka_widths" in REGISTRY[arch].fields:
            assert sae.cfg.matryoshka_widths == [8, 16, 32, 64]
    _, cfg = build("standard", recipe("standard"), 16, 64, 5, 0.5, "synthetic", {})
    assert cfg.l1_coefficient == pytest.approx(ARCHITECTURE_DEFAULTS["standard"]["l1_coefficient"] * 0.5)
    _, cfg = build("jumprelu", recipe("jumprelu", {"l0_coefficient": 2.0}), 16, 64, 5, 0.5, "synthetic", {})
    assert cfg.l0_coefficient == pytest.approx(2.0 * 0.25) and cfg.jumprelu_sparsity_loss_mode == "tanh"


def test_parse_override_reads_json_values_and_plain_strings():
    assert parse_override("topk.k=8") == ("topk", "k", 8)
    assert parse_override("jumprelu.jumprelu_sparsity_loss_mode=step") == (
        "jumprelu",
        "jumprelu_sparsity_loss_mode",
        "step",
    )
    assert parse_override("standard.l1_coefficient=1.5") == ("standard", "l1_coefficient", 1.5)


# ----------------------------------------------------------------------------
# bad input, refused by name before anything trains
# ----------------------------------------------------------------------------
BAD: list[tuple[list[str], str]] = [
    (["--architecture", "topkk"], "--architecture: 'topkk' is not an architecture (did you mean 'topk'"),
    (["--architecture", "temporal"], "'temporal' is inference only"),
    (["--architecture", "topk", "topk"], "'topk' given twice"),
    (["--seeds", "0"], "--seeds=0 is out of range"),
    (["--no-synthetic", "--no-real"], "nothing left to benchmark"),
    (["--synthetic-steps", "0"], "--synthetic-steps=0 is out of range"),
    (["--k", "100", "--d-sae", "32"], "--k=100 is out of range"),
    (["--target-l0", "999"], "--target-l0=999 is out of range"),
    (["--set", "topk.k"], "--set='topk.k': expected ARCHITECTURE.FIELD=VALUE"),
    (["--set", "gated.k=4"], "--set gated.k=4: 'k' is not a gated SAE's field"),
    (["--set", "topk.kk=4"], "'kk' is neither an SAEConfig nor an SAETrainingConfig field (did you mean 'k'"),
    (["--set", "topk.lr=1"], "'lr' is the run's own"),
    (["--architecture", "topk", "--set", "gated.l1_coefficient=2"], "--set['gated']: 'gated' is not benchmarked"),
    (["--set", "topk.k=100"], "topk (planted hierarchy, d_sae=36): k=100"),
    (["--hook", "blocks.1.hook_resid_pree"], "did you mean"),
    (["--hook", "blocks.0.attn.hook_pattern"], "--hook='blocks.0.attn.hook_pattern' holds no vector per token"),
    (["--data", "/no/such/corpus"], "--data '/no/such/corpus': no such file or folder"),
    (["--context-size", "4096"], "--context-size=4096 is out of range: contexts of tiny-gpt2 are 2..128"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_refused_by_name_before_training(capsys, tmp_path, text, argv, message):
    data = [] if "--data" in argv else ["--data", str(text)]
    rc, out, err = run(capsys, "--out", str(tmp_path / "o"), *data, *TINY_REAL, *argv, "--no-progress")
    assert rc == 2 and message in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()  # one line; nothing written


def test_an_out_that_is_a_file_is_refused(capsys, tmp_path, text):
    (tmp_path / "f").write_text("x")
    rc, _, err = run(capsys, "--out", str(tmp_path / "f"), "--data", str(text), "--no-progress")
    assert rc == 2 and "is a file; expected a folder" in err


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seeds": []}, "seeds=[]: expected at least one seed"),
        ({"seeds": [0, 0]}, "repeats a seed"),
        ({"seeds": [-1]}, "seeds[0]=-1 is out of range"),
        ({"architectures": []}, "expected at least one architecture"),
        ({"architectures": "topk"}, "must be a list of architecture names"),
        ({"synthetic": None, "real": None}, "nothing to benchmark"),
        ({"overrides": {"jumprelu": {"l0_coefficient": 1}}, "architectures": ["topk"]}, "not benchmarked"),
    ],
)
def test_the_config_refuses_bad_values_by_name(kwargs: dict[str, Any], message: str):
    with pytest.raises((TypeError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")):
        SAEBenchConfig(**kwargs)
