"""Many SAEs from one forward (`interp_gpt.sae.training.multi`): each SAE of a lockstep run is bit-identical to
training it alone on the same batches (N hooks, N widths, N architectures; its log too, NaN stops included);
the multi-hook store serves each hook the rows a store of its own serves; train-sae with several --hook /
--d-sae writes one loadable SAE per folder; bad input is refused by name."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt.cli import main as cli_main
from interp_gpt.loading import from_pretrained
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.training import (
    MultiSAETrainer,
    MultiTrainingError,
    NonFiniteTrainingError,
    SAETrainer,
    SAETrainingConfig,
    activation_batches,
    main,
    sae_name,
    token_windows,
    train_saes,
)
from interp_gpt.sae.training import sae_command as train_command

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"
WIDTHS = {"blocks.0.hook_resid_pre": 16, "blocks.0.hook_mlp_out": 24, "blocks.1.hook_resid_pre": 16}


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: small matrices run faster on one thread)


@pytest.fixture(scope="module")
def model() -> Any:
    return from_pretrained("tiny-gpt2").eval()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return [CORPUS.read_text(encoding="utf-8")[:30_000]]


def toy_sae(hook: str, arch: str = "topk", d_sae: int = 32, d_in: int | None = None, **kw: Any) -> SAE:
    if arch == "topk":
        kw.setdefault("k", 4)
    d = WIDTHS[hook] if d_in is None else d_in
    return SAE(SAEConfig(d_in=d, d_sae=d_sae, architecture=arch, metadata={"hook_name": hook}, **kw))


def stream(n_batches: int, n: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Multi-hook batches: the same rows for every hook (here random, sparse-ish, some large)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        out.append({h: torch.randn(n, d, generator=g).relu() * 3 for h, d in WIDTHS.items()})
    return out


def alone(sae: SAE, cfg: SAETrainingConfig, xs: list[torch.Tensor], n_steps: int, **kw: Any) -> SAETrainer:
    trainer = SAETrainer(sae, copy.deepcopy(cfg), **kw)
    trainer.train(iter(xs), n_steps, progress=False)
    return trainer


def assert_same(a: SAETrainer, b: SAETrainer, logged: bool = True) -> None:
    """Weights, dead-feature counts, Adam's moments and the log (but its wall-clock rate) bit for bit."""
    for (k, x), y in zip(a.sae.state_dict().items(), b.sae.state_dict().values(), strict=True):
        assert torch.equal(x, y), k
    assert torch.equal(a.steps_since_fired, b.steps_since_fired)
    for p, q in zip(a.optimizer.param_groups[0]["params"], b.optimizer.param_groups[0]["params"], strict=True):
        sa, sb = a.optimizer.state.get(p, {}), b.optimizer.state.get(q, {})
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert (a.n_steps, a.n_tokens) == (b.n_steps, b.n_tokens)
    strip = [{k: v for k, v in e.items() if k != "tokens_per_s"} for e in a.log]
    assert strip == [{k: v for k, v in e.items() if k != "tokens_per_s"} for e in b.log]
    assert bool(strip) == logged


# ----------------------------------------------------------------------------
# each SAE of a lockstep run equals training it alone
# ----------------------------------------------------------------------------
CFG = SAETrainingConfig(lr=3e-3, lr_warm_up_steps=3, lr_decay_steps=4, l1_warm_up_steps=5, dead_feature_window=3,
                        log_every=2, seed=7)  # fmt: skip


@pytest.mark.parametrize("arch", ["topk", "standard"])
def test_n_hooks_each_sae_equals_training_it_alone(arch: str) -> None:
    batches = stream(9)
    saes = {h: toy_sae(h, arch, d_sae=192, **({"k": 2} if arch == "topk" else {})) for h in WIDTHS}
    before = copy.deepcopy(saes)
    trainer = MultiSAETrainer(saes, CFG)
    logs = trainer.train(iter(batches), 9, progress=False)
    assert list(logs) == list(WIDTHS) and trainer.n_steps == 9 and not trainer.errors
    for hook in WIDTHS:
        solo = alone(before[hook], CFG, [b[hook] for b in batches], 9)
        assert_same(trainer.trainers[hook], solo)
    aux = [e for e in logs["blocks.0.hook_mlp_out"] if "aux" in e]
    assert arch == "standard" or aux, "dead features never appeared: the AuxK path went untested"


def test_n_widths_and_architectures_on_one_hook_each_equal_training_alone() -> None:
    hook = "blocks.0.hook_mlp_out"
    saes = [toy_sae(hook, "topk", 32), toy_sae(hook, "topk", 64, k=8), toy_sae(hook, "standard", 32)]
    before = copy.deepcopy(saes)
    cfgs = [CFG, SAETrainingConfig(lr=1e-3, log_every=3), SAETrainingConfig(lr=2e-3, l1_coefficient=0.1)]
    xs = [b[hook] for b in stream(7)]
    trainer = MultiSAETrainer(saes, cfgs)
    trainer.train(iter(xs), 7, progress=False)  # one tensor per step: every SAE reads the one hook
    assert list(trainer.trainers) == [f"{hook}-topk-32", f"{hook}-topk-64", f"{hook}-standard-32"]
    for name, sae, cfg in zip(trainer.trainers, before, cfgs, strict=True):
        assert_same(trainer.trainers[name], alone(sae, cfg, xs, 7))


def test_two_train_calls_and_a_step_equal_the_same_calls_alone() -> None:
    hook = "blocks.0.hook_resid_pre"
    sae, xs = toy_sae(hook), [b[hook] for b in stream(5)]
    cfg = SAETrainingConfig(lr=3e-3, lr_decay_steps=2, log_every=2)
    solo = SAETrainer(copy.deepcopy(sae), copy.deepcopy(cfg))
    solo.train(iter(xs[:2]), 2, progress=False)
    solo.train(iter(xs[2:4]), 2, progress=False)
    solo.step(xs[4])
    trainer = MultiSAETrainer({"a": sae}, cfg)
    trainer.train(iter(xs[:2]), 2, progress=False)
    trainer.train(iter(xs[2:4]), 2, progress=False)
    parts = trainer.step(xs[4])
    assert set(parts) == {"a"} and {"loss", "mse", "feats"} <= set(parts["a"]) and trainer.n_steps == 5
    assert_same(trainer.trainers["a"], solo)
    assert trainer.logs == {"a": trainer.trainers["a"].log} and trainer.dead_fraction == {"a": solo.dead_fraction}


def test_the_ce_loss_recovered_is_logged_as_alone(model: Any, texts: list[str]) -> None:
    hook = "blocks.1.hook_resid_pre"
    tokens = token_windows(model, texts, 16, max_windows=2)
    xs = [next(activation_batches(model, hook, texts, 128, 16))] * 3
    sae = toy_sae(hook, d_in=128, d_sae=64)
    cfg = SAETrainingConfig(lr=1e-3, log_every=1, eval_every=2)
    solo = alone(copy.deepcopy(sae), cfg, xs, 3, model=model, eval_tokens=tokens)
    trainer = MultiSAETrainer([sae], cfg, model, tokens)
    trainer.train(iter(xs), 3, progress=False)
    assert_same(trainer.trainers[sae_name(sae)], solo)
    assert [("val_ce_loss_recovered" in e) for e in solo.log] == [False, True, True]
    assert trainer.evaluate()[sae_name(sae)] == solo.evaluate()


# ----------------------------------------------------------------------------
# NaN and divergence: the SAE concerned stops as it would alone, the others train on
# ----------------------------------------------------------------------------
def test_a_diverging_sae_stops_as_alone_and_the_others_train_to_the_end() -> None:
    hook = "blocks.0.hook_resid_pre"
    saes = {"good": toy_sae(hook), "bad": toy_sae(hook)}
    before = copy.deepcopy(saes)
    cfgs = {"good": SAETrainingConfig(lr=3e-3, log_every=1), "bad": SAETrainingConfig(lr=1e30, log_every=1)}
    xs = [b[hook] for b in stream(5)]
    trainer = MultiSAETrainer(saes, cfgs)
    with pytest.raises(MultiTrainingError, match=r"SAE 'bad' stopped: SAETrainer: the loss at step 2 is") as info:
        trainer.train(iter(xs), 5, progress=False)
    assert list(info.value.errors) == ["bad"] and isinstance(info.value, ValueError)
    solo = SAETrainer(before["bad"], copy.deepcopy(cfgs["bad"]))
    with pytest.raises(NonFiniteTrainingError) as solo_error:
        solo.train(iter(xs), 5, progress=False)
    got = info.value.errors["bad"]
    assert (got.step, got.last_good_step) == (solo_error.value.step, solo_error.value.last_good_step) == (2, 0)
    assert_same(trainer.trainers["bad"], solo, logged=False)  # both rolled back to the initial weights
    assert_same(trainer.trainers["good"], alone(before["good"], cfgs["good"], xs, 5))
    assert trainer.trainers["good"].n_steps == 5 and trainer.trainers["bad"].n_steps == 0


def nan_after_update(trainer: SAETrainer, step: int) -> None:
    """Make Adam's update of step `step` leave a NaN in W_enc (a finite loss, weights gone bad)."""
    real, calls = trainer.optimizer.step, []

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == step:
            trainer.sae.W_enc.data[0, 0] = float("nan")
        return out

    trainer.optimizer.step = poisoned  # type: ignore[method-assign]


def test_a_last_step_that_leaves_nan_weights_rolls_back_as_alone() -> None:
    hook = "blocks.0.hook_resid_pre"
    saes = {"good": toy_sae(hook), "nan": toy_sae(hook)}
    before = copy.deepcopy(saes)
    cfg = SAETrainingConfig(lr=3e-3, log_every=1)
    xs = [b[hook] for b in stream(3)]
    trainer = MultiSAETrainer(saes, cfg)
    nan_after_update(trainer.trainers["nan"], 3)
    with pytest.raises(MultiTrainingError, match=r"'nan' stopped: SAETrainer: step 3 left NaN or inf") as info:
        trainer.train(iter(xs), 3, progress=False)
    solo = SAETrainer(before["nan"], copy.deepcopy(cfg))
    nan_after_update(solo, 3)
    with pytest.raises(NonFiniteTrainingError, match="step 3 left NaN or inf") as solo_error:
        solo.train(iter(xs), 3, progress=False)
    assert info.value.errors["nan"].last_good_step == solo_error.value.last_good_step == 2
    assert_same(trainer.trainers["nan"], solo)  # rolled back to the state after step 2, log cut there
    assert [e["step"] for e in solo.log] == [1.0, 2.0]
    assert_same(trainer.trainers["good"], alone(before["good"], cfg, xs, 3))


def test_a_nan_in_one_hooks_rows_stops_only_the_saes_on_that_hook() -> None:
    batches = stream(4)
    batches[2]["blocks.0.hook_mlp_out"][5, 1] = float("nan")
    saes = [
        toy_sae("blocks.0.hook_mlp_out"),
        toy_sae("blocks.0.hook_mlp_out", d_sae=40),
        toy_sae("blocks.0.hook_resid_pre"),
    ]
    trainer = MultiSAETrainer(saes, SAETrainingConfig(lr=3e-3, log_every=1))
    with pytest.raises(MultiTrainingError) as info:
        trainer.train(iter(batches), 4, progress=False)
    assert list(info.value.errors) == ["blocks.0.hook_mlp_out-topk-32", "blocks.0.hook_mlp_out-topk-40"]
    assert "the batch of step 3 holds nan at [row 5, column 1]" in str(info.value)
    assert [t.n_steps for t in trainer.trainers.values()] == [2, 2, 4]


# ----------------------------------------------------------------------------
# the data: one multi-hook store serves each hook the rows of a store of its own
# ----------------------------------------------------------------------------
def test_the_multi_hook_store_serves_each_hook_the_rows_of_its_own_store(model: Any, texts: list[str]) -> None:
    hooks = ["blocks.0.hook_resid_pre", "blocks.0.hook_mlp_out", "blocks.1.attn.hook_z", "blocks.1.hook_resid_pre"]
    kw: dict[str, Any] = {"batch_size": 256, "context_size": 32, "seed": 3}
    multi = activation_batches(model, hooks, texts, **kw)
    served = [next(multi) for _ in range(10)]
    for hook in hooks[:3]:  # bit for bit
        single = activation_batches(model, hook, texts, **kw)
        assert all(torch.equal(next(single), b[hook]) for b in served), hook
    # A store of blocks.1.hook_resid_pre alone takes the plain forward (fused kernels), a store of several hooks
    # the cached forward's explicit maths: the same rows, equal to rounding, and bit for bit to those of the
    # same activation read from a cache by a store of its own (blocks.0.hook_resid_post).
    alone_, cached = (activation_batches(model, h, texts, **kw) for h in hooks[3:] + ["blocks.0.hook_resid_post"])
    for b in served:
        x, y = next(alone_), b["blocks.1.hook_resid_pre"]
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5)
        assert torch.equal(next(cached), y)


def test_train_saes_equals_each_sae_trained_alone_on_its_own_store(model: Any, texts: list[str]) -> None:
    kw: dict[str, Any] = {"batch_size": 128, "context_size": 32, "seed": 1}
    hooks = ["blocks.0.hook_mlp_out", "blocks.1.attn.hook_z", "blocks.1.hook_resid_post"]
    cfg = SAETrainingConfig(lr=2e-3, log_every=2)
    for case in (hooks, ["blocks.1.hook_resid_pre"] * 2):  # N hooks; N widths on the default hook
        saes = [toy_sae(h, "topk", 64 + 32 * i, d_in=128) for i, h in enumerate(case)]
        before = copy.deepcopy(saes)
        trainer = train_saes(model, saes, texts, 5, cfg, progress=False, **kw)
        for sae, name in zip(before, trainer.trainers, strict=True):
            batches = activation_batches(model, sae.cfg.hook_name, texts, **kw)
            assert_same(trainer.trainers[name], alone(sae, cfg, batches, 5))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------
# train-sae with several --hook / --architecture / --d-sae
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text(CORPUS.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return folder


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train-sae", "--data", str(data), "--k", "4", "--batch-size", "512", "--n-tokens", "2048",
            "--val-windows", "4", "--no-progress", "--out", str(out), *extra]  # fmt: skip


def test_train_sae_with_several_hooks_and_widths_writes_one_loadable_sae_each(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "saes"
    hooks = ["blocks.0.hook_mlp_out", "blocks.1.hook_resid_pre"]
    assert main(_argv(data_dir, out, "--hook", *hooks, "--d-sae", "32", "--d-sae", "64")[1:]) == 0  # python -m
    names = [f"{h}-topk-{w}" for h in hooks for w in (32, 64)]
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "metrics.json"])
    summary = json.loads((out / "metrics.json").read_text())
    assert list(summary["saes"]) == names and summary["stopped"] == {}
    for name in names:
        sae = SAE.from_pretrained(out / name)
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert metrics == summary["saes"][name] and metrics["steps"] == 4 and metrics["train_tokens"] == 2048
        assert metrics["validation"]["n_tokens"] == 4 * 128 and metrics["validation"]["l0"] <= 4
        assert f"{sae.cfg.hook_name}-topk-{sae.cfg.d_sae}" == name and len(metrics["trained_with"]) == 3
        assert metrics["command"].startswith("python -m interp_gpt.sae.training --data")
    # each equals the run of its own (its hook's rows are bit for bit those of a one-hook store)
    assert cli_main(_argv(data_dir, tmp_path / "one", "--hook", hooks[0], "--d-sae", "64")) == 0
    one, multi = SAE.from_pretrained(tmp_path / "one"), SAE.from_pretrained(out / names[1])
    assert all(torch.equal(x, y) for x, y in zip(one.state_dict().values(), multi.state_dict().values(), strict=True))
    assert (tmp_path / "one" / "cfg.json").is_file()  # one SAE: the folder itself, as before


def test_train_sae_help_says_where_several_saes_go(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["train-sae", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "OUT/<hook>-<architecture>-<d_sae>" in text and "(default: blocks.1.hook_resid_pre)" in text
    assert "(default: 1024)" in text and "(default: topk)" in text


def test_train_sae_with_several_saes_saves_the_good_ones_when_one_hook_meets_nan(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = train_command.activation_batches

    def poisoned(*args: Any, **kwargs: Any) -> Iterator[dict[str, torch.Tensor]]:
        for i, batch in enumerate(real(*args, **kwargs)):
            if i == 2:
                batch = {**batch, "blocks.0.hook_mlp_out": batch["blocks.0.hook_mlp_out"].clone()}
                batch["blocks.0.hook_mlp_out"][7, 3] = float("nan")
            yield batch

    monkeypatch.setattr(train_command, "activation_batches", poisoned)
    out = tmp_path / "saes"
    argv = _argv(data_dir, out, "--hook", "blocks.0.hook_mlp_out", "blocks.0.hook_attn_out", "--log-every", "1")
    assert cli_main([*argv, "--d-sae", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SAE 'blocks.0.hook_mlp_out-topk-32' stopped" in err
    assert "the batch of step 3 holds nan at [row 7, column 3]" in err
    assert f"saved in {out / 'blocks.0.hook_mlp_out-topk-32' / 'last_good'}" in err
    SAE.from_pretrained(out / "blocks.0.hook_mlp_out-topk-32" / "last_good")
    assert not (out / "blocks.0.hook_mlp_out-topk-32" / "cfg.json").exists()
    good = json.loads((out / "blocks.0.hook_attn_out-topk-32" / "metrics.json").read_text())
    assert good["steps"] == 4 and good["validation"] is not None
    summary = json.loads((out / "metrics.json").read_text())
    assert list(summary["saes"]) == ["blocks.0.hook_attn_out-topk-32"] and list(summary["stopped"]) == [
        "blocks.0.hook_mlp_out-topk-32"
    ]


# ----------------------------------------------------------------------------
# bad input, refused by name
# ----------------------------------------------------------------------------
def test_bad_saes_and_configs_are_refused_by_name(model: Any) -> None:
    hook = "blocks.0.hook_resid_pre"
    sae = toy_sae(hook)
    with pytest.raises(KeyError, match=r"saes\['x'\]: .*no hook point named 'blocks.0.hook_resid_pr'.*did you mean"):
        MultiSAETrainer({"x": SAE(SAEConfig(d_in=128, d_sae=8, metadata={"hook_name": hook[:-1]}))}, model=model)
    with pytest.raises(
        ValueError, match=r"saes\['b'\]: d_in=24 does not fit hook 'blocks.0.hook_mlp_out', whose rows are 128 wide$"
    ):
        MultiSAETrainer({"a": toy_sae(hook, d_in=128), "b": toy_sae("blocks.0.hook_mlp_out")}, model=model)
    with pytest.raises(
        ValueError, match=r"d_in=16 does not fit hook 'blocks.0.attn.hook_z', whose rows are 128 wide \(4"
    ):
        MultiSAETrainer(
            {"z": SAE(SAEConfig(d_in=16, d_sae=8, metadata={"hook_name": "blocks.0.attn.hook_z"}))}, model=model
        )
    with pytest.raises(ValueError, match=r"saes\[1\]: a second SAE named 'blocks.0.hook_resid_pre-topk-32'"):
        MultiSAETrainer([sae, toy_sae(hook)])
    with pytest.raises(ValueError, match=r"saes\['b'\] is the same SAE object as saes\['a'\]"):
        MultiSAETrainer({"a": sae, "b": sae})
    with pytest.raises(ValueError, match=r"cfg: 1 configs for 2 SAEs"):
        MultiSAETrainer([sae, toy_sae(hook, d_sae=40)], [SAETrainingConfig()])
    with pytest.raises(ValueError, match=r"cfg: its names must be the SAEs' names; missing \['b'\], unknown \['c'\]"):
        MultiSAETrainer({"a": sae, "b": toy_sae(hook, d_sae=40)}, {"a": SAETrainingConfig(), "c": SAETrainingConfig()})
    with pytest.raises(TypeError, match=r"cfg\['a'\]: expected a SAETrainingConfig, got dict"):
        MultiSAETrainer({"a": sae}, {"a": {"lr": 1.0}})
    with pytest.raises(ValueError, match=r"saes\['a'\]: cfg.metadata.hook_name is not set"):
        MultiSAETrainer({"a": SAE(SAEConfig(d_in=16, d_sae=8))})
    with pytest.raises(ValueError, match=r"saes\['a'\]: sae.cfg.architecture='temporal' is inference only"):
        MultiSAETrainer({"a": toy_sae(hook, "temporal", n_heads=2, bottleneck_factor=4)})
    with pytest.raises(ValueError, match="saes: expected at least one SAE"):
        MultiSAETrainer({})
    with pytest.raises(TypeError, match=r"saes\[0\]: expected an interp_gpt SAE, got str"):
        MultiSAETrainer(["not an SAE"])


def test_bad_batches_are_refused_by_name_before_any_sae_steps() -> None:
    a, b = toy_sae("blocks.0.hook_resid_pre"), toy_sae("blocks.0.hook_mlp_out")
    trainer = MultiSAETrainer({"a": a, "b": b})
    good = stream(1)[0]
    with pytest.raises(KeyError, match=r"step 1 has no rows of 'blocks.0.hook_mlp_out' \(SAE 'b'\)"):
        trainer.step({"blocks.0.hook_resid_pre": good["blocks.0.hook_resid_pre"]})
    with pytest.raises(
        ValueError, match=r"holds \(64, 16\) for 'blocks.0.hook_mlp_out'; SAE 'b' expects \[batch, d_in=24\]"
    ):
        trainer.step({**good, "blocks.0.hook_mlp_out": good["blocks.0.hook_resid_pre"]})
    with pytest.raises(ValueError, match=r"holds \[32, 64\] rows for different hooks"):
        trainer.step({**good, "blocks.0.hook_mlp_out": good["blocks.0.hook_mlp_out"][:32]})
    with pytest.raises(
        TypeError, match=r"one tensor; SAEs on hooks \['blocks.0.hook_mlp_out', 'blocks.0.hook_resid_pre'\]"
    ):
        trainer.step(good["blocks.0.hook_resid_pre"])
    with pytest.raises(ValueError, match=r"batches: ran out after 1 steps \(n_steps asked 3\)"):
        trainer.train(iter([good]), 3, progress=False)
    assert trainer.trainers["a"].n_steps == trainer.trainers["b"].n_steps == 1  # the refused batches changed nothing
    with pytest.raises(ValueError, match="n_steps=0 is out of range"):
        trainer.train(iter([good]), 0)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            ["--hook", "blocks.0.hook_mlp_out", "blocks.0.hook_mlp_out"],
            "--hook: 'blocks.0.hook_mlp_out' is given twice",
        ),
        (["--d-sae", "32", "--d-sae", "32"], "--d-sae: 32 is given twice"),
        (["--architecture", "topk", "topk"], "--architecture: 'topk' is given twice"),
        (["--d-sae", "32", "0"], "--d-sae=0 is out of range"),
        (["--d-sae", "64", "2", "--k", "4"], "--k=4 is out of range: a topk SAE keeps 1..--d-sae=2"),
        (
            ["--hook", "blocks.0.hook_mlp_out", "blocks.1.hook_resid_pr"],
            "--hook: no hook point named 'blocks.1.hook_resid_pr'",
        ),
        (["--hook", "blocks.0.hook_mlp_out", "blocks.1.attn.hook_pattern"], "--hook='blocks.1.attn.hook_pattern' is"),
    ],
)
def test_train_sae_with_several_saes_refuses_bad_options_in_one_line(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    assert cli_main(_argv(data_dir, tmp_path / "saes", *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err, err
    assert not (tmp_path / "saes").exists()
