"""SAE training on bad input: every config field, bad batches, NaN / inf and divergence, hook_z and the
train-sae command. Each case asserts the error type and that the message names the argument (and its
value); the NaN cases also check that no weight is left NaN and that nothing NaN is saved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from interp_gpt.cli import main as cli_main
from interp_gpt.loading import from_pretrained
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.training import NonFiniteTrainingError, SAETrainer, SAETrainingConfig, evaluate_sae
from interp_gpt.sae.training import sae_command as train_command

HOOK = "blocks.0.hook_resid_pre"
CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def toy_sae(arch: str = "topk", d_in: int = 16, d_sae: int = 32, **kw: Any) -> SAE:
    if arch == "topk":
        kw.setdefault("k", 4)
    return SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=arch, metadata={"hook_name": HOOK}, **kw))


def rows(n_batches: int, d_in: int = 16, n: int = 64, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d_in, generator=g) for _ in range(n_batches)]


def weights(sae: SAE) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in sae.state_dict().items()}


def all_finite(sae: SAE) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in sae.parameters())


# ----------------------------------------------------------------------------
# SAETrainingConfig: every field, by name, type and range
# ----------------------------------------------------------------------------
BAD_FIELDS = [
    ("lr", -1.0, ValueError, r"lr=-1\.0 is out of range"),
    ("lr", 0, ValueError, r"lr=0 is out of range"),
    ("lr", float("nan"), ValueError, r"lr=nan is out of range"),
    ("lr", "0.1", TypeError, r"lr must be a number, got str"),
    ("adam_betas", (0.9,), TypeError, r"adam_betas must be a pair"),
    ("adam_betas", 0.9, TypeError, r"adam_betas must be a pair"),
    ("adam_betas", (0.9, 1.0), ValueError, r"adam_betas\[1\]=1\.0 is out of range"),
    ("adam_betas", (-0.1, 0.999), ValueError, r"adam_betas\[0\]=-0\.1 is out of range"),
    ("adam_betas", (float("nan"), 0.999), ValueError, r"adam_betas\[0\]=nan"),
    ("lr_warm_up_steps", -5, ValueError, r"lr_warm_up_steps=-5 is out of range: expected an int >= 0"),
    ("lr_warm_up_steps", 2.5, TypeError, r"lr_warm_up_steps must be an int, got float"),
    ("lr_decay_steps", -1, ValueError, r"lr_decay_steps=-1 is out of range"),
    ("l1_coefficient", float("nan"), ValueError, r"l1_coefficient=nan is out of range"),
    ("l1_coefficient", -0.5, ValueError, r"l1_coefficient=-0\.5 is out of range: expected a finite number >= 0"),
    ("l1_coefficient", None, TypeError, r"l1_coefficient must be a number, got NoneType"),
    ("l1_warm_up_steps", -1, ValueError, r"l1_warm_up_steps=-1 is out of range"),
    ("aux_coefficient", float("inf"), ValueError, r"aux_coefficient=inf is out of range"),
    ("aux_coefficient", -1, ValueError, r"aux_coefficient=-1 is out of range"),
    ("dead_feature_window", 0, ValueError, r"dead_feature_window=0 is out of range: expected an int >= 1"),
    ("normalize_decoder", "yes", TypeError, r"normalize_decoder must be True or False or None"),
    ("init_weights", 1, TypeError, r"init_weights must be True or False, got int \(1\)"),
    ("init_b_dec_to_mean", None, TypeError, r"init_b_dec_to_mean must be True or False"),
    ("log_every", 0, ValueError, r"log_every=0 is out of range: expected an int >= 1"),
    ("log_every", -100, ValueError, r"log_every=-100 is out of range"),
    ("eval_every", -1, ValueError, r"eval_every=-1 is out of range: expected an int >= 0"),
    ("seed", -1, ValueError, r"seed=-1 is out of range"),
    ("seed", True, TypeError, r"seed must be an int, got bool"),
    ("keep_last_good", "no", TypeError, r"keep_last_good must be True or False"),
    ("history", {}, TypeError, r"history must be a list, got dict"),
    ("clip_grad_norm", 0, ValueError, r"clip_grad_norm=0 would zero every step; use None"),
    ("clip_grad_norm", -1.0, ValueError, r"clip_grad_norm=-1\.0 is out of range"),
    ("l0_coefficient", -1.0, ValueError, r"l0_coefficient=-1\.0 is out of range"),
    ("l0_warm_up_steps", -1, ValueError, r"l0_warm_up_steps=-1 is out of range"),
    ("jumprelu_init_threshold", float("nan"), ValueError, r"jumprelu_init_threshold=nan is out of range"),
    ("jumprelu_bandwidth", 0, ValueError, r"jumprelu_bandwidth=0 is out of range: expected a finite number > 0"),
    ("jumprelu_sparsity_loss_mode", "l1", ValueError, r"jumprelu_sparsity_loss_mode='l1'; expected 'step', 'tanh'"),
    ("jumprelu_tanh_scale", -4, ValueError, r"jumprelu_tanh_scale=-4 is out of range"),
    ("jumprelu_ste_to_input", "false", TypeError, r"jumprelu_ste_to_input must be True or False"),
    ("pre_act_loss_coefficient", -3e-6, ValueError, r"pre_act_loss_coefficient=-3e-06 is out of range"),
    ("target_l0", "10", TypeError, r"target_l0 must be a number, got str"),
    ("topk_threshold_lr", -0.01, ValueError, r"topk_threshold_lr=-0\.01 is out of range"),
    ("use_matryoshka_aux_loss", 1, TypeError, r"use_matryoshka_aux_loss must be True or False"),
]


@pytest.mark.parametrize(("field", "value", "error", "match"), BAD_FIELDS, ids=[f"{c[0]}={c[1]!r}" for c in BAD_FIELDS])
def test_each_bad_config_field_is_refused_at_construction(field: str, value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match="SAETrainingConfig: " + match):
        SAETrainingConfig(**{field: value})


def test_every_config_field_has_a_bad_value_case() -> None:
    from dataclasses import fields

    assert {f.name for f in fields(SAETrainingConfig)} == {c[0] for c in BAD_FIELDS}


def test_a_field_changed_after_construction_is_checked_by_the_trainer() -> None:
    cfg = SAETrainingConfig()
    cfg.lr_decay_steps = -3
    with pytest.raises(ValueError, match=r"lr_decay_steps=-3 is out of range"):
        SAETrainer(toy_sae(), cfg)
    with pytest.raises(TypeError, match=r"cfg: expected a SAETrainingConfig, got dict"):
        SAETrainer(toy_sae(), {"lr": 1e-3})  # type: ignore[arg-type]


def test_good_values_at_the_edges_are_taken() -> None:
    cfg = SAETrainingConfig(lr=1, adam_betas=[0, 0.5], l1_coefficient=0, aux_coefficient=0, eval_every=0, seed=0)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.adam_betas == (0.0, 0.5)


# ----------------------------------------------------------------------------
# batches of the wrong shape or type
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        (
            torch.randn(4, 8, 16),
            ValueError,
            r"batch of step 1 has shape \(4, 8, 16\), expected \[batch, d_in=16\].*reshape",
        ),
        (torch.randn(4, 15), ValueError, r"batch of step 1 has shape \(4, 15\), expected \[batch, d_in=16\]"),
        (torch.randn(16), ValueError, r"batch of step 1 has shape \(16,\), expected \[batch, d_in=16\]"),
        (torch.randn(0, 16), ValueError, r"batch of step 1 has shape \(0, 16\)"),
        (torch.ones(4, 16, dtype=torch.long), TypeError, r"batch of step 1 has dtype torch.int64"),
        ([[0.0] * 16] * 4, TypeError, r"batch of step 1 must be a tensor.*got list"),
    ],
)
def test_a_batch_of_the_wrong_shape_names_the_step_its_shape_and_the_expected_one(
    batch: Any, error: type, match: str
) -> None:
    sae = toy_sae()
    before = weights(sae)
    with pytest.raises(error, match=match):
        SAETrainer(sae).step(batch)
    assert all(torch.equal(before[k], v) for k, v in weights(sae).items())


def test_a_bad_batch_inside_train_is_named_by_its_step() -> None:
    data = rows(2) + [torch.randn(64, 8)]
    with pytest.raises(ValueError, match=r"batch of step 3 has shape \(64, 8\)"):
        SAETrainer(toy_sae()).train(iter(data), n_steps=3, progress=False)


# ----------------------------------------------------------------------------
# TopK with d_in = 1
# ----------------------------------------------------------------------------
def test_topk_with_d_in_1_trains_and_its_auxk_loss_matches_a_hand_computation() -> None:
    sae = toy_sae("topk", d_in=1, d_sae=4, k=1)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-3, dead_feature_window=1, aux_coefficient=0.5))
    data = rows(6, d_in=1)
    trainer.train(iter(data[:5]), n_steps=5, progress=False)  # was a ZeroDivisionError once a feature died
    dead = trainer.steps_since_fired >= 1
    assert 0 < int(dead.sum()) < 4  # k=1 of 4: some features stay silent on a batch
    x = data[5]
    _, parts = trainer.losses(x)
    with torch.no_grad():  # sae-lens' AuxK written out, k_aux = 1: each row's largest dead pre-activation
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        top = pre.topk(1, dim=-1)
        f = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        residual = x - (f @ sae.W_dec + sae.b_dec)
        want = 0.0
        for r in range(x.shape[0]):
            j = max((i for i in range(4) if dead[i]), key=lambda i: float(pre[r, i]))
            want += float(((pre[r, j] * sae.W_dec[j] - residual[r]) ** 2).sum())
        want = 0.5 * min(int(dead.sum()) / 1, 1.0) * want / x.shape[0]
    assert float(parts["aux"].detach()) == pytest.approx(want, rel=1e-5)
    assert all_finite(sae)


# ----------------------------------------------------------------------------
# NaN / inf batches and a diverging learning rate
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("arch", ["topk", "standard"])
def test_a_nan_or_inf_batch_is_refused_by_step_before_it_touches_the_weights(arch: str, bad: float) -> None:
    sae = toy_sae(arch)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-3))
    data = rows(3)
    trainer.train(iter(data[:2]), n_steps=2, progress=False)
    before = weights(sae)
    x = data[2].clone()
    x[2, 5] = bad
    with pytest.raises(NonFiniteTrainingError, match=rf"batch of step 3 holds {bad} at \[row 2, column 5\]") as e:
        trainer.step(x)
    assert isinstance(e.value, ValueError)
    assert (e.value.step, e.value.last_good_step) == (3, 2) and "state after step 2" in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in weights(sae).items())  # untouched, so finite
    assert trainer.n_steps == 2
    trainer.step(data[2])  # training can go on with good batches


def test_a_nan_first_batch_does_not_set_b_dec_to_nan() -> None:
    sae = toy_sae()
    x = rows(1)[0]
    x[0, 0] = float("nan")
    with pytest.raises(NonFiniteTrainingError, match=r"batch of step 1 holds nan at \[row 0, column 0\]"):
        SAETrainer(sae).train(iter([x]), n_steps=1, progress=False)
    assert all_finite(sae)


def _diverging() -> tuple[SAETrainingConfig, list[torch.Tensor]]:
    # lr 5e8 warmed up over 30 steps: finite losses for 4 steps, then NaN at step 5
    return SAETrainingConfig(lr=5e8, lr_warm_up_steps=30, log_every=2), rows(20)


def test_a_diverging_learning_rate_stops_at_its_step_and_rolls_back_to_the_last_good_state() -> None:
    cfg, data = _diverging()
    sae = toy_sae()
    trainer = SAETrainer(sae, cfg)
    with pytest.raises(
        NonFiniteTrainingError, match=r"the loss at step 5 is (nan|inf) on a finite batch: training diverged"
    ) as e:
        trainer.train(iter(data), n_steps=20, progress=False)
    assert (e.value.step, e.value.last_good_step) == (5, 2) and "state after step 2" in str(e.value)
    assert all_finite(sae) and trainer.n_steps == 2 and [r["step"] for r in trainer.log] == [2.0]
    # the state after step 2 is what a run of 2 steps on the same batches gives (an independent run)
    twin = toy_sae()
    SAETrainer(twin, SAETrainingConfig(lr=5e8, lr_warm_up_steps=30, log_every=2)).train(
        iter(data), n_steps=2, progress=False
    )
    assert all(torch.equal(weights(twin)[k], v) for k, v in weights(sae).items())


def test_without_keeping_the_last_good_state_the_error_still_names_the_step_and_the_weights() -> None:
    cfg, data = _diverging()
    cfg.keep_last_good = False
    sae = toy_sae()
    with pytest.raises(NonFiniteTrainingError, match=r"the loss at step 5") as e:
        SAETrainer(sae, cfg).train(iter(data), n_steps=20, progress=False)
    assert e.value.last_good_step is None
    assert (
        "No good state was kept to roll back to (cfg.keep_last_good=False): the SAE holds its weights after step 4"
        in str(e.value)
    )


def test_nan_weights_left_by_the_last_step_are_caught_at_the_end_of_train() -> None:
    sae = toy_sae("standard")
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-3, log_every=2))
    step = trainer.optimizer.step

    def poisoned(*args: Any, **kwargs: Any) -> Any:  # the 4th (last) update leaves a NaN behind
        out = step(*args, **kwargs)
        if trainer.n_steps == 3:
            with torch.no_grad():
                sae.W_enc[0, 0] = float("nan")
        return out

    trainer.optimizer.step = poisoned  # type: ignore[method-assign]
    with pytest.raises(NonFiniteTrainingError, match=r"step 4 left NaN or inf in the weights") as e:
        trainer.train(iter(rows(4)), n_steps=4, progress=False)
    assert e.value.last_good_step == 2 and all_finite(sae) and trainer.n_steps == 2


# ----------------------------------------------------------------------------
# the trainer's own evaluation: checked before the first step
# ----------------------------------------------------------------------------
def test_a_trainer_whose_final_evaluation_cannot_run_is_refused_at_construction(tiny_model: Any) -> None:
    tokens = torch.randint(0, tiny_model.cfg.d_vocab, (2, 8))
    with pytest.raises(ValueError, match=r"sae.cfg.d_in=16 does not fit 'blocks.0.hook_resid_pre'"):
        SAETrainer(toy_sae(), model=tiny_model, eval_tokens=tokens)
    wide = toy_sae(d_in=tiny_model.cfg.d_model)
    with pytest.raises(TypeError, match=r"SAETrainer: eval_tokens must hold integer token ids"):
        SAETrainer(wide, model=tiny_model, eval_tokens=tokens.float())
    bad = tokens.clone()
    bad[1, 3] = 100
    with pytest.raises(ValueError, match=r"SAETrainer: eval_tokens: token id 100 at \[batch, posn\] = \[1, 3\]"):
        SAETrainer(wide, model=tiny_model, eval_tokens=bad)


# ----------------------------------------------------------------------------
# the train-sae command
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text(CORPUS.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return folder


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train-sae", "--data", str(data), "--d-sae", "64", "--k", "4", "--batch-size", "512",
            "--n-tokens", "2048", "--val-windows", "4", "--no-progress", "--out", str(out), *extra]  # fmt: skip


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_train_sae_with_a_misspelt_hook_is_one_line_with_a_suggestion_before_any_work(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("harvested or trained with a misspelt hook")

    monkeypatch.setattr(train_command, "split_corpus", no_work)
    monkeypatch.setattr(train_command, "activation_batches", no_work)
    monkeypatch.setattr(SAETrainer, "train", no_work)
    code = cli_main(_argv(data_dir, tmp_path / "sae", "--hook", "blocks.1.hook_resid_pr"))
    err = _one_line(capsys)
    assert code == 2
    assert "--hook: no hook point named 'blocks.1.hook_resid_pr'; did you mean 'blocks.1.hook_resid_pre'" in err
    assert not (tmp_path / "sae").exists()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--lr-warm-up-steps", "-3"], "--lr-warm-up-steps=-3 is out of range"),
        (["--lr-decay-steps", "-1"], "--lr-decay-steps=-1 is out of range"),
        (["--lr", "nan"], "--lr=nan is out of range"),
        (["--lr", "-0.1"], "--lr=-0.1 is out of range"),
        (["--l1-coefficient", "-1"], "--l1-coefficient=-1.0 is out of range"),
        (["--log-every", "0"], "--log-every=0 is out of range"),
        (["--seed", "-2"], "--seed=-2 is out of range"),
        (["--d-sae", "0"], "--d-sae=0 is out of range"),
        (["--k", "0"], "--k=0 is out of range"),
        (["--k", "65"], "--k=65 is out of range: a topk SAE keeps 1..--d-sae=64"),
        (["--batch-size", "0"], "--batch-size=0 is out of range"),
        (["--n-tokens", "0"], "--n-tokens=0 is out of range"),
        (["--context-size", "1"], "--context-size=1 is out of range"),
        (["--val-windows", "-1"], "--val-windows=-1 is out of range"),
        (["--threads", "-1"], "--threads=-1 is out of range"),
        (["--val-frac", "0.9"], "--val-frac=0.9 is out of range"),
    ],
)
def test_train_sae_bad_options_are_one_line_before_the_model_loads(
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    match: str,
) -> None:
    import interp_gpt.loading

    def no_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("loaded the model before checking the options")

    monkeypatch.setattr(interp_gpt.loading, "from_pretrained", no_model)
    assert cli_main(_argv(data_dir, tmp_path / "sae", *extra)) == 2
    assert match in _one_line(capsys)


def test_train_sae_with_out_a_file_is_refused(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("x")
    assert cli_main(_argv(data_dir, tmp_path / "f")) == 2
    assert f"--out={str(tmp_path / 'f')!r} is a file" in _one_line(capsys)


def test_train_sae_with_a_context_longer_than_the_model_names_the_option(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(_argv(data_dir, tmp_path / "sae", "--context-size", "2000")) == 2
    assert "--context-size=2000 is out of range: contexts of tiny-gpt2 are 2..128" in _one_line(capsys)


def test_train_sae_on_a_non_per_token_hook_is_refused_before_training(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(_argv(data_dir, tmp_path / "sae", "--hook", "blocks.1.attn.hook_pattern")) == 2
    assert "--hook='blocks.1.attn.hook_pattern' is [1, 4, 2, 2]" in _one_line(capsys)


def test_train_sae_on_hook_z_works_end_to_end(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = "blocks.0.attn.hook_z"
    assert cli_main(_argv(data_dir, tmp_path / "z", "--hook", hook)) == 0
    metrics = json.loads((tmp_path / "z" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["validation"]["n_tokens"] == 4 * 128
    sae = SAE.from_pretrained(tmp_path / "z")
    model = from_pretrained("tiny-gpt2")
    model.eval()
    n_heads, d_head = model.cfg.n_heads, model.cfg.d_head
    assert sae.cfg.reshape_activations == "hook_z" and sae.cfg.d_in == n_heads * d_head and sae.cfg.hook_name == hook
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 16), generator=torch.Generator().manual_seed(0))
    got = evaluate_sae(model, sae, tokens, batch_size=2)
    with torch.no_grad():  # the SAE's maths on the flattened heads, from a plain cached run
        _, cache = model.run_with_cache(tokens)
        x = cache[hook].reshape(-1, n_heads * d_head)
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        top = pre.topk(4, dim=-1)
        x_hat = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu()) @ sae.W_dec + sae.b_dec
        replaced = x_hat.reshape(cache[hook].shape)
        logits = model.run_with_hooks(tokens, fwd_hooks=[(hook, lambda a, hook: replaced)])
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    assert got["mse"] == pytest.approx(float((x - x_hat).pow(2).sum(-1).mean()), rel=1e-5)
    assert got["ce_spliced"] == pytest.approx(float(ce), rel=1e-5)


def _fail_final_evaluation(monkeypatch: pytest.MonkeyPatch, error: Exception) -> list[int]:
    real, calls = train_command.evaluate_sae, []

    def evaluate(model: Any, sae: SAE, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(tokens.shape[0])
        if len(calls) == 1:  # the check before the first step runs for real
            return real(model, sae, tokens, *args, **kwargs)
        raise error

    monkeypatch.setattr(train_command, "evaluate_sae", evaluate)
    return calls


def test_a_failing_final_evaluation_leaves_the_trained_sae_saved(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fail_final_evaluation(monkeypatch, ValueError("simulated evaluation failure"))
    assert cli_main(_argv(data_dir, tmp_path / "sae")) == 2
    err = _one_line(capsys)
    assert f"the trained SAE is saved in {tmp_path / 'sae'}" in err and "simulated evaluation failure" in err
    assert calls == [1, 4]  # one window before step 1, the validation windows after the save
    sae = SAE.from_pretrained(tmp_path / "sae")
    assert sae.cfg.k == 4 and all_finite(sae)
    metrics = json.loads((tmp_path / "sae" / "metrics.json").read_text())
    assert metrics["validation"] is None and metrics["steps"] == 4 and metrics["train_tokens"] == 2048


def test_a_crashing_final_evaluation_leaves_the_trained_sae_saved_and_says_so(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fail_final_evaluation(monkeypatch, RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        cli_main(_argv(data_dir, tmp_path / "sae"))
    assert f"the trained SAE is saved in {tmp_path / 'sae'}" in capsys.readouterr().err
    SAE.from_pretrained(tmp_path / "sae")


def test_train_sae_meeting_a_nan_batch_stops_and_saves_only_the_last_good_state(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = train_command.activation_batches

    def poisoned(*args: Any, **kwargs: Any) -> Iterator[torch.Tensor]:
        for i, x in enumerate(real(*args, **kwargs)):
            if i == 2:
                x = x.clone()
                x[7, 3] = float("nan")
            yield x

    monkeypatch.setattr(train_command, "activation_batches", poisoned)
    out = tmp_path / "sae"
    assert cli_main(_argv(data_dir, out, "--log-every", "1")) == 2
    err = _one_line(capsys)
    assert "the batch of step 3 holds nan at [row 7, column 3]" in err
    assert f"state after step 2, the last good one; saved in {out / 'last_good'}" in err
    assert not (out / "cfg.json").exists() and not (out / "sae_weights.safetensors").exists()
    assert all_finite(SAE.from_pretrained(out / "last_good"))  # (the loader refuses non-finite weights too)


def test_train_sae_with_a_diverging_lr_saves_nothing_nan(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sae"
    assert cli_main(_argv(data_dir, out, "--lr", "1e30")) == 2
    err = _one_line(capsys)
    assert "the loss at step 2 is" in err and "training diverged (lr=1e+30" in err and "initial weights" in err
    assert not (out / "sae_weights.safetensors").exists() and not (out / "last_good").exists()
