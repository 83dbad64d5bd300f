"""Transcoder training on bad input: the trainer's arguments, config fields and batches, NaN / inf and
divergence, evaluate_transcoders on transcoders that do not fit, and the train-transcoder command (every
bad option one line and exit 2 before any work; a run stopped by NaN saves only its last good state).
Each case asserts the error type and that the message names the argument (and its value)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt.cli import main as cli_main
from interp_gpt.loading import from_pretrained
from interp_gpt.sae import CLTConfig, CrossLayerTranscoder, Transcoder, TranscoderConfig, load_transcoders
from interp_gpt.sae.training import transcoder_command as command
from interp_gpt.sae.training.sae_trainer import NonFiniteTrainingError, SAETrainingConfig
from interp_gpt.sae.training.transcoder_trainer import TranscoderTrainer, TranscoderTrainingConfig
from interp_gpt.sae.transcoders.evaluation import evaluate_transcoders

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def plt(layer: int = 0, arch: str = "topk", d: int = 16, **kw: Any) -> Transcoder:
    if arch == "topk":
        kw.setdefault("k", 4)
    meta = {"hook_name": f"blocks.{layer}.ln2.hook_normalized", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
    return Transcoder(TranscoderConfig(d_in=d, d_sae=32, d_out=d, architecture=arch, metadata=meta, **kw))


def all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


# ----------------------------------------------------------------------------------------------
# the trainer's arguments and config
# ----------------------------------------------------------------------------------------------
def test_what_is_not_a_transcoder_set_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"TranscoderTrainer: transcoders: expected a Transcoder.*got str"):
        TranscoderTrainer("tc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"TranscoderTrainer: transcoders: expected .* got list"):
        TranscoderTrainer([])
    with pytest.raises(TypeError, match=r"TranscoderTrainer: transcoders\[1\]: expected a Transcoder, got int"):
        TranscoderTrainer([plt(0), 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"transcoders\[1\].cfg.architecture='relu' but transcoders\[0\]'s is 'topk'"):
        TranscoderTrainer([plt(0), plt(1, "relu")])
    with pytest.raises(ValueError, match=r"transcoders\[1\].cfg.d_in=8 but transcoders\[0\]'s is 16"):
        TranscoderTrainer([plt(0), plt(1, d=8)])
    with pytest.raises(ValueError, match=r"transcoders: layers \[1\] are given twice"):
        TranscoderTrainer([plt(1), plt(1)])
    with pytest.raises(TypeError, match=r"cfg: expected a TranscoderTrainingConfig, got SAETrainingConfig"):
        TranscoderTrainer(plt(), SAETrainingConfig())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"model and eval_tokens: pass both"):
        TranscoderTrainer(plt(), model=object())


BAD_FIELDS = [
    ("l0_coefficient", -1.0, ValueError, r"l0_coefficient=-1\.0 is out of range"),
    ("l0_coefficient", "1", TypeError, r"l0_coefficient must be a number, got str"),
    ("l0_warm_up_steps", -1, ValueError, r"l0_warm_up_steps=-1 is out of range"),
    ("jumprelu_init_threshold", float("nan"), ValueError, r"jumprelu_init_threshold=nan is out of range"),
    ("jumprelu_bandwidth", 0.0, ValueError, r"jumprelu_bandwidth=0\.0 is out of range: expected a finite number > 0"),
    ("jumprelu_bandwidth", -0.1, ValueError, r"jumprelu_bandwidth=-0\.1 is out of range"),
    ("lr", -1.0, ValueError, r"lr=-1\.0 is out of range"),  # the SAE config's checks, named by this config
    ("adam_betas", (0.9, 1.0), ValueError, r"adam_betas\[1\]=1\.0 is out of range"),
]


@pytest.mark.parametrize(("field", "value", "error", "match"), BAD_FIELDS, ids=[f"{c[0]}={c[1]!r}" for c in BAD_FIELDS])
def test_each_bad_config_field_is_refused_naming_the_transcoder_config(
    field: str, value: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match="TranscoderTrainingConfig: " + match):
        TranscoderTrainingConfig(**{field: value})


def test_every_field_the_transcoder_config_adds_has_a_bad_value_case() -> None:
    added = {f.name for f in fields(TranscoderTrainingConfig)} - {f.name for f in fields(SAETrainingConfig)}
    assert added <= {c[0] for c in BAD_FIELDS}


def test_a_field_changed_after_construction_is_checked_by_the_trainer() -> None:
    cfg = TranscoderTrainingConfig()
    cfg.jumprelu_bandwidth = -1.0
    with pytest.raises(ValueError, match=r"jumprelu_bandwidth=-1\.0 is out of range"):
        TranscoderTrainer(plt(arch="jumprelu"), cfg)


# ----------------------------------------------------------------------------------------------
# batches
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        (
            torch.randn(4, 16),
            TypeError,
            r"batch of step 1 must be \(inputs, targets\) or a dict hook -> rows, got Tensor",
        ),
        (
            (torch.randn(4, 15), torch.randn(4, 16)),
            ValueError,
            r"inputs have shape \(4, 15\), expected \[batch, d_in=16\]",
        ),
        (
            (torch.randn(4, 16), torch.randn(4, 8)),
            ValueError,
            r"targets have shape \(4, 8\), expected \[batch, d_out=16\]",
        ),
        ((torch.randn(4, 16), torch.randn(5, 16)), ValueError, r"inputs hold 4 rows but targets 5"),
        ((torch.randn(0, 16), torch.randn(0, 16)), ValueError, r"inputs have shape \(0, 16\)"),
        ((torch.ones(4, 16, dtype=torch.long), torch.randn(4, 16)), TypeError, r"inputs have dtype torch.int64"),
        (([0.0] * 16, torch.randn(4, 16)), TypeError, r"inputs must be a tensor.*got list"),
        ({"blocks.0.ln2.hook_normalized": torch.randn(4, 16)}, KeyError, r"lacks 'blocks.0.hook_mlp_out'"),
    ],
)
def test_a_bad_batch_names_the_step_the_part_and_the_expected_shape(batch: Any, error: type, match: str) -> None:
    tc = plt()
    before = {k: v.clone() for k, v in tc.state_dict().items()}
    with pytest.raises(error, match=match):
        TranscoderTrainer(tc).step(batch)
    assert all(torch.equal(v, before[k]) for k, v in tc.state_dict().items())


def test_a_set_needs_every_layer_in_its_batch() -> None:
    trainer = TranscoderTrainer([plt(0), plt(1)])
    with pytest.raises(ValueError, match=r"inputs have shape \(4, 16\), expected \[n_layers=2, batch, d_in=16\]"):
        trainer.step((torch.randn(4, 16), torch.randn(4, 16)))
    clt = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=16, d_sae=32, d_out=16))
    with pytest.raises(ValueError, match=r"targets have shape \(1, 4, 16\), expected \[n_layers=2, batch, d_out=16\]"):
        TranscoderTrainer(clt).step((torch.randn(2, 4, 16), torch.randn(1, 4, 16)))


def test_dict_batches_need_the_hooks_named_in_the_config() -> None:
    tc = Transcoder(TranscoderConfig(d_in=16, d_sae=32, d_out=16))
    with pytest.raises(ValueError, match=r"hook_name / hook_name_out are not set.*pass \(inputs, targets\) tuples"):
        TranscoderTrainer(tc).step({"x": torch.randn(4, 16)})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_first_batch_leaves_the_initial_weights(bad: float) -> None:
    tc = plt(skip=True)
    before = {k: v.clone() for k, v in tc.state_dict().items()}
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    y[2, 5] = bad
    with pytest.raises(
        NonFiniteTrainingError, match=rf"step 1 holds {bad} in the targets of layer 0 at \[row 2, column 5\]"
    ):
        TranscoderTrainer(tc).step((x, y))
    assert all(torch.equal(v, before[k]) for k, v in tc.state_dict().items())  # b_dec not set from NaN


def test_a_diverging_learning_rate_rolls_back_to_the_last_good_state() -> None:
    clt = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=16, d_sae=32, d_out=16, architecture="relu"))
    trainer = TranscoderTrainer(clt, TranscoderTrainingConfig(lr=1e30, log_every=1))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(2, 32, 16, generator=g), torch.randn(2, 32, 16, generator=g)) for _ in range(5)]
    with pytest.raises(
        NonFiniteTrainingError, match=r"TranscoderTrainer: the loss at step 2 .* training diverged"
    ) as e:
        trainer.train(iter(data), n_steps=5, progress=False)
    assert e.value.last_good_step == 0 and all_finite(clt)
    assert "The transcoders hold their initial weights, the last good one" in str(e.value)


# ----------------------------------------------------------------------------------------------
# evaluate_transcoders on transcoders that do not fit the model
# ----------------------------------------------------------------------------------------------
def test_evaluate_transcoders_refuses_what_does_not_fit_the_model() -> None:
    model = from_pretrained("tiny-gpt2")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 8))
    with pytest.raises(ValueError, match=r"d_in=16 does not fit 'blocks.0.ln2.hook_normalized', which is d_model=128"):
        evaluate_transcoders(model, plt(0), tokens)
    with pytest.raises(ValueError, match=r"layer 5 does not exist: the model's layers are 0..1"):
        evaluate_transcoders(model, plt(5, d=128), tokens)
    wide = {"d_in": 128, "d_sae": 32, "d_out": 128}
    with pytest.raises(ValueError, match=r"evaluate_transcoders: the CLT has 3 layers but the model 2"):
        evaluate_transcoders(model, CrossLayerTranscoder(CLTConfig(n_layers=3, **wide)), tokens)  # type: ignore[arg-type]
    meta = {"hook_name": "ln2.hook_normalised", "hook_name_out": "hook_mlp_out"}
    clt = CrossLayerTranscoder(CLTConfig(n_layers=2, **wide, metadata=meta))  # type: ignore[arg-type]
    with pytest.raises(KeyError, match=r"blocks.0.ln2.hook_normalised.*did you mean 'blocks.0.ln2.hook_normalized'"):
        evaluate_transcoders(model, clt, tokens)
    with pytest.raises(ValueError, match=r"evaluate_transcoders: tokens: token id 60000"):
        evaluate_transcoders(model, plt(0, d=128), torch.full((1, 4), 60000))


# ----------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text(CORPUS.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    return folder


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train-transcoder", "--data", str(data), "--d-sae", "32", "--k", "4", "--batch-size", "128",
            "--n-tokens", "512", "--context-size", "32", "--val-windows", "2", "--no-progress",
            "--out", str(out), *extra]  # fmt: skip


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def _no(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("work began before every input was checked")


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            ["--input-hook", "ln2.hook_normalised"],
            "--input-hook='ln2.hook_normalised': expected one of ln2.hook_normalized, hook_resid_mid; did you mean 'ln2.hook_normalized'?",
        ),
        (["--kind", "clt", "--format", "saelens"], "--format='saelens': a CLT is saved as circuit-tracer's CLT folder"),
        (["--l0-coefficient", "-1"], "--l0-coefficient=-1.0 is out of range"),
        (["--jumprelu-bandwidth", "0"], "--jumprelu-bandwidth=0.0 is out of range: expected a finite number > 0"),
        (["--jumprelu-init-threshold", "inf"], "--jumprelu-init-threshold=inf is out of range"),
        (["--l1-coefficient", "-1"], "--l1-coefficient=-1.0 is out of range"),
        (["--lr", "nan"], "--lr=nan is out of range"),
        (["--k", "33"], "--k=33 is out of range"),
        (["--d-sae", "0"], "--d-sae=0 is out of range"),
        (["--batch-size", "0"], "--batch-size=0 is out of range"),
        (["--n-tokens", "0"], "--n-tokens=0 is out of range"),
        (["--val-frac", "0.9"], "--val-frac=0.9 is out of range"),
    ],
)
def test_bad_options_are_one_line_before_the_model_loads(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    extra: list[str], match: str,
) -> None:  # fmt: skip
    import interp_gpt.loading

    monkeypatch.setattr(interp_gpt.loading, "from_pretrained", _no)
    assert cli_main(_argv(data_dir, tmp_path / "t", *extra)) == 2
    assert match in _one_line(capsys)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--layers", "5"], "--layers='5': layer 5 does not exist: tiny-gpt2's layers are 0..1"),
        (["--layers", "0,x"], "--layers='0,x': expected 'all' or comma-separated layers such as 0,1"),
        (["--layers", "1,1"], "--layers='1,1': a layer is given twice"),
        (
            ["--kind", "clt", "--layers", "1"],
            "--layers='1': a CLT covers layers 0..N-1 (its layer l writes every layer >= l); missing [0]",
        ),
        (
            ["--layers", "1", "--format", "circuit-tracer"],
            "--format=circuit-tracer: format='circuit-tracer' holds the layers 0..n-1",
        ),
        (
            ["--format", "circuit-tracer", "--input-hook", "hook_resid_mid", "--context-size", "500"],
            "--context-size=500 is out of range: contexts of tiny-gpt2 are 2..128",
        ),
    ],
)
def test_bad_inputs_that_need_the_model_are_one_line_before_any_harvest_or_step(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    extra: list[str], match: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(command, "activation_batches", _no)
    monkeypatch.setattr(TranscoderTrainer, "train", _no)
    assert cli_main(_argv(data_dir, tmp_path / "t", *extra)) == 2
    assert match in _one_line(capsys)
    assert not (tmp_path / "t").exists()


def test_out_a_file_or_a_folder_of_other_files_is_refused(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("x")
    assert cli_main(_argv(data_dir, tmp_path / "f")) == 2
    assert f"--out={str(tmp_path / 'f')!r} is a file" in _one_line(capsys)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    assert cli_main(_argv(data_dir, tmp_path / "d")) == 2
    assert "holds other files (notes.txt)" in _one_line(capsys)
    assert (tmp_path / "d" / "notes.txt").read_text() == "mine"


def test_a_missing_corpus_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(_argv(tmp_path / "nothing", tmp_path / "t")) == 2
    line = _one_line(capsys)
    assert f"--data {str(tmp_path / 'nothing')!r}: no such file or folder" in line and "data_dir" not in line


def test_a_nan_batch_stops_the_run_and_saves_only_the_last_good_state(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = command.activation_batches

    def poisoned(*args: Any, **kwargs: Any) -> Iterator[dict[str, torch.Tensor]]:
        for i, batch in enumerate(real(*args, **kwargs)):
            if i == 2:
                batch = dict(batch)
                batch["blocks.1.hook_mlp_out"] = batch["blocks.1.hook_mlp_out"].clone()
                batch["blocks.1.hook_mlp_out"][7, 3] = float("nan")
            yield batch

    monkeypatch.setattr(command, "activation_batches", poisoned)
    out = tmp_path / "t"
    assert cli_main(_argv(data_dir, out, "--log-every", "1")) == 2
    err = _one_line(capsys)
    assert "the batch of step 3 holds nan in the targets of layer 1 at [row 7, column 3]" in err
    assert f"state after step 2, the last good one; saved in {out / 'last_good'}" in err
    assert not (out / "layer_0").exists() and not (out / "metrics.json").exists()
    tcs = load_transcoders(out / "last_good")  # (the loader refuses non-finite weights too)
    assert [tc.layer for tc in tcs] == [0, 1] and all(all_finite(tc) for tc in tcs)


def test_a_diverging_lr_saves_nothing_nan(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"
    assert cli_main(_argv(data_dir, out, "--kind", "clt", "--lr", "1e30")) == 2
    err = _one_line(capsys)
    assert "the loss at step 2 is" in err and "training diverged (lr=1e+30" in err and "initial weights" in err
    assert not out.exists() or not any(out.iterdir())


def test_a_failing_final_evaluation_leaves_the_trained_set_saved(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real, calls = command.evaluate_transcoders, []

    def evaluate(model: Any, tcs: Any, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(tokens.shape[0])
        if len(calls) == 1:  # the check before the first step runs for real
            return real(model, tcs, tokens, *args, **kwargs)
        raise ValueError("simulated evaluation failure")

    monkeypatch.setattr(command, "evaluate_transcoders", evaluate)
    out = tmp_path / "t"
    assert cli_main(_argv(data_dir, out)) == 2
    err = _one_line(capsys)
    assert f"the trained transcoders are saved in {out}" in err and "simulated evaluation failure" in err
    assert calls == [1, 2]
    assert [tc.layer for tc in load_transcoders(out)] == [0, 1]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["validation"] is None and metrics["steps"] == 4


def test_a_trainer_whose_evaluation_cannot_run_is_refused_at_construction() -> None:
    model = from_pretrained("tiny-gpt2")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 8))
    with pytest.raises(ValueError, match=r"d_in=16 does not fit 'blocks.0.ln2.hook_normalized'"):
        TranscoderTrainer(plt(0), model=model, eval_tokens=tokens)
    with pytest.raises(TypeError, match=r"TranscoderTrainer: eval_tokens must hold integer token ids"):
        TranscoderTrainer(plt(0, d=128), model=model, eval_tokens=tokens.float())
