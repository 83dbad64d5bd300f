"""Issue 36, third reliability pass over the lenses: each test reproduces one defect found by the outside pass
and fails without its fix (logit_lens on unequal prompts, fit_tuned_lens' resume / save_to / seed / data
checks, lens files that cannot be read, the train-lens command's provenance and its errors)."""

from __future__ import annotations

import argparse
import json
import pickle
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, CheckpointError
from interp_gpt.cli import main
from interp_gpt.lenses import TunedLens, fit_tuned_lens, jacobian_lens, lens_kl, logit_lens
from interp_gpt.lenses import command as lens_command
from interp_gpt.lenses.tuned import reads_the_mean


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


# ----------------------------------------------------------------------------
# row 1: logit_lens on prompts of unequal length reads each at its own tokens, never at a pad
# ----------------------------------------------------------------------------
def test_logit_lens_reads_each_unequal_prompt_at_its_own_last_token(model: GPT) -> None:
    prompts = ["The war", "The war was long and hard"]
    batch = logit_lens(model, prompts)
    for i, prompt in enumerate(prompts):
        alone = logit_lens(model, prompt)
        assert _close(batch.values[:, i], alone.values[:, 0])
    n_short, n_long = (model.to_tokens(p).shape[1] for p in prompts)
    assert batch.positions == [n_short - 1, n_long - 1]
    second = logit_lens(model, prompts, positions=1)  # a non-negative int: the same in every prompt
    assert _close(second.values[:, 0], logit_lens(model, "The war", positions=1).values[:, 0])


def test_logit_lens_refuses_a_selection_that_would_read_pads(model: GPT) -> None:
    prompts = ["The war", "The war was long and hard"]
    n_short, n_long = (model.to_tokens(p).shape[1] for p in prompts)
    with pytest.raises(ValueError, match=rf"unequal lengths \[{n_short}, {n_long}\].*positions=None"):
        logit_lens(model, prompts, positions=None)
    too_far = -(n_short + 1)
    with pytest.raises(ValueError, match=rf"positions={too_far} is out of range for tokens\[0\], which has {n_short}"):
        logit_lens(model, prompts, positions=too_far)
    equal = logit_lens(model, ["The war", "The war"], positions=None)  # one length: every selection reads
    assert equal.values.shape[:3] == (model.cfg.n_layers + 1, 2, n_short)


# ----------------------------------------------------------------------------
# row 4: resume=True refuses other data of the same shape, by its digest
# ----------------------------------------------------------------------------
def _ids(model: GPT, seed: int, n: int = 4, pos: int = 16) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (n, pos), generator=torch.Generator().manual_seed(seed))


def test_resume_refuses_other_data_of_the_same_shape(model: GPT, tmp_path) -> None:
    fit_tuned_lens(model, _ids(model, 0), steps=4, batch_size=2, save_to=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"data: the token windows differ .*data_sha256"):
        fit_tuned_lens(model, _ids(model, 1), steps=4, batch_size=2, save_to=tmp_path, resume=True, progress=False)
    fit_tuned_lens(model, _ids(model, 0), steps=4, batch_size=2, save_to=tmp_path, resume=True, progress=False)


# ----------------------------------------------------------------------------
# row 5: train-lens' metrics.json records every option that changes the results
# ----------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text((REPO / "data" / "corpus" / "tinyshakespeare_input.txt").read_text(encoding="utf-8")[:20_000])
    return path


def _train(corpus: Path, out: Path, *extra: str) -> int:
    argv = ["train-lens", "--data", str(corpus), "--steps", "2", "--batch-size", "2", "--context-size", "16"]
    return main([*argv, "--out", str(out), "--no-progress", *extra])


def test_the_recorded_command_repeats_the_run(small_corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert _train(small_corpus, tmp_path / "lens", "--val-windows", "3", "--seed", "5") == 0
    first = json.loads((tmp_path / "lens" / "metrics.json").read_text())
    assert "--val-windows 3" in first["command"] and first["validation_tokens"] == 3 * 16
    assert main([*shlex.split(first["command"])[1:], "--no-progress"]) == 0  # the recorded command, rerun
    again = json.loads((tmp_path / "lens" / "metrics.json").read_text())
    assert again["validation_tokens"] == first["validation_tokens"]
    assert torch.allclose(
        torch.tensor(again["held_out_kl"]["tuned_lens"]), torch.tensor(first["held_out_kl"]["tuned_lens"]), rtol=1e-5
    )
    # every option of the command is either recorded or changes nothing the run writes
    parser = argparse.ArgumentParser()
    lens_command.add_arguments(parser)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == set(lens_command.RESULT_OPTIONS) | set(lens_command.OTHER_OPTIONS)


# ----------------------------------------------------------------------------
# row 9b: resume=True on a folder with a lens but no training state is refused (it would overwrite the lens)
# ----------------------------------------------------------------------------
def test_resume_refuses_a_lens_folder_without_training_state(model: GPT, tmp_path: Path) -> None:
    lens = fit_tuned_lens(model, _ids(model, 0), steps=2, batch_size=2, progress=False)
    lens.save(tmp_path)
    saved = lens[0].weight.detach().clone()
    with pytest.raises(ValueError, match=r"resume=True: .* holds a lens .* but no training_state.pt"):
        fit_tuned_lens(model, _ids(model, 0), steps=1, batch_size=2, save_to=tmp_path, resume=True, progress=False)
    assert torch.equal(TunedLens.from_pretrained(tmp_path, model)[0].weight, saved)  # the folder's lens is intact
    # the way on that the message gives: the folder's lens as model_or_lens
    on = fit_tuned_lens(
        TunedLens.from_pretrained(tmp_path, model), _ids(model, 0), steps=1, batch_size=2, progress=False
    )
    assert not torch.equal(on[0].weight, saved)
    # an empty folder (or none yet): a first run, nothing to refuse
    fit_tuned_lens(model, _ids(model, 0), steps=1, batch_size=2, save_to=tmp_path / "new", resume=True, progress=False)


# ----------------------------------------------------------------------------
# row 9: save_to is checked before the first step (a file, or a path below a file)
# ----------------------------------------------------------------------------
def test_save_to_a_file_is_refused_before_the_first_step(model: GPT, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    steps = []
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, closure=None: steps.append(1))
    note = tmp_path / "notes.txt"
    note.write_text("x")
    for save_to, blocked in ((note, " is a file"), (note / "lens", f": {str(note)!r} is a file")):
        for resume in (False, True):
            with pytest.raises(
                ValueError, match=rf"fit_tuned_lens: save_to={str(save_to)!r}{blocked}; expected a folder"
            ):
                fit_tuned_lens(
                    model, _ids(model, 0), steps=2, batch_size=2, save_to=save_to, resume=resume, progress=False
                )
    assert steps == []  # refused before any step
    with pytest.raises(ValueError, match=r"path=.*lens': .*notes.txt' is a file"):
        TunedLens.from_model(model).save(note / "lens")  # the same check where a lens is saved


# ----------------------------------------------------------------------------
# row 10: seeds checked up front, by name
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seed", "error", "message"),
    [
        (1.5, TypeError, r"fit_tuned_lens: seed must be an int, got float \(1.5\)"),
        ("0", TypeError, r"fit_tuned_lens: seed must be an int, got str"),
        (-1, ValueError, r"fit_tuned_lens: seed=-1 is out of range: seeds are 0\.\."),
        (2**64, ValueError, rf"fit_tuned_lens: seed={2**64} is out of range"),
        (2**64 - 1, ValueError, rf"fit_tuned_lens: seed={2**64 - 1} is out of range"),
        (2**63 - 3, ValueError, rf"fit_tuned_lens: seed={2**63 - 3} is out of range: seeds are 0\.\.{2**63 - 4}"),
    ],
)
def test_fit_tuned_lens_checks_its_seed_before_any_step(model: GPT, monkeypatch, seed, error, message) -> None:  # type: ignore[no-untyped-def]
    steps = []
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, closure=None: steps.append(1))
    with pytest.raises(error, match=message):
        fit_tuned_lens(model, _ids(model, 0), steps=3, batch_size=2, seed=seed, progress=False)
    assert steps == []
    fit_tuned_lens(model, _ids(model, 0), steps=3, batch_size=2, seed=2**63 - 4, progress=False)  # the largest


def test_train_lens_checks_its_seed_before_loading(small_corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert _train(small_corpus, tmp_path / "lens", "--seed", "-1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--seed=-1 is out of range: seeds are 0.." in err


# ----------------------------------------------------------------------------
# row 14: a lens blind to the stream's mean loads across centring; one that reads it stays refused
# ----------------------------------------------------------------------------
def test_a_lens_trained_on_a_centred_stream_reads_the_raw_one_alike(model: GPT, tmp_path: Path) -> None:
    raw = GPT.from_pretrained_no_processing("tiny-gpt2")
    data, tokens = _ids(model, 0, n=8, pos=32), _ids(model, 9, n=2, pos=32)
    trained = fit_tuned_lens(model, data, steps=10, batch_size=2, progress=False)
    assert max(reads_the_mean(t.weight) for t in trained) < 1e-6  # its gradients never reach the mean direction
    trained.save(tmp_path / "processed")
    on_raw = TunedLens.from_pretrained(tmp_path / "processed", raw)
    ours, theirs = trained.forward_all(tokens).log_softmax(-1), on_raw.forward_all(tokens).log_softmax(-1)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5 * float(ours.abs().max()))
    # the reverse: trained on the raw stream, its translators read the mean that centring takes away
    from_raw = fit_tuned_lens(raw, data, steps=10, batch_size=2, progress=False)
    assert max(reads_the_mean(t.weight) for t in from_raw) > 1e-2
    from_raw.save(tmp_path / "raw")
    with pytest.raises(ValueError, match=r"trained on a raw residual stream .* read the stream's mean"):
        TunedLens.from_pretrained(tmp_path / "raw", model)


# ----------------------------------------------------------------------------
# row 17: fit_tuned_lens and jacobian_lens under torch.inference_mode() fit as they do outside it
# ----------------------------------------------------------------------------
def test_the_fits_leave_inference_mode(model: GPT) -> None:
    data, prompts = _ids(model, 0), ["The cat sat on the mat."]
    outside = fit_tuned_lens(model, data, steps=2, batch_size=2, progress=False)
    j_outside = jacobian_lens(model, prompts, skip_first_positions=2)
    with torch.inference_mode():
        inside = fit_tuned_lens(model, data, steps=2, batch_size=2, progress=False)
        j_inside = jacobian_lens(model, prompts, skip_first_positions=2)
        tokens = _ids(model, 1)  # an inference tensor as data: read, never differentiated
        fit_tuned_lens(model, tokens, steps=1, batch_size=2, progress=False)
    for a, b in zip(inside.state_dict().values(), outside.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()))
    torch.testing.assert_close(j_inside.J, j_outside.J, rtol=1e-5, atol=1e-6 * float(j_outside.J.abs().max()))
    assert not any(p.is_inference() for p in inside.parameters())  # a lens that trains on afterwards


def test_a_model_made_in_inference_mode_is_refused_by_name() -> None:
    with torch.inference_mode():
        frozen = GPT.from_pretrained("tiny-gpt2")
    data = _ids(frozen, 0)
    with pytest.raises(ValueError, match=r"fit_tuned_lens: model_or_lens's .* was made under torch.inference_mode"):
        fit_tuned_lens(frozen, data, steps=1, batch_size=2, progress=False)
    with pytest.raises(ValueError, match=r"jacobian_lens: model's .* was made under torch.inference_mode"):
        jacobian_lens(frozen, ["The cat sat on the mat."], skip_first_positions=2)


# ----------------------------------------------------------------------------
# row 18: a lens file that cannot be read raises a CheckpointError naming it; the commands say so in one line
# ----------------------------------------------------------------------------
def _spoil(path: Path, kind: str) -> None:
    content = path.read_bytes()
    spoilt = {
        "empty": b"",
        "truncated": content[: len(content) // 2],
        "text": b"hello",
        "foreign": pickle.dumps({"x": ValueError("not a tensor")}),
    }
    if kind == "tensor":
        torch.save(torch.zeros(3), path)
    else:
        path.write_bytes(spoilt[kind])


@pytest.fixture(scope="module")
def saved_run(model: GPT, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    fit_tuned_lens(model, _ids(model, 0), steps=2, batch_size=2, save_to=folder, progress=False)
    return folder


@pytest.mark.parametrize("kind", ["empty", "truncated", "text", "foreign", "tensor"])
def test_an_unreadable_lens_file_is_a_checkpoint_error_naming_it(
    model: GPT, saved_run: Path, tmp_path: Path, kind: str, capsys
) -> None:  # type: ignore[no-untyped-def]
    for name in ("params.pt", "training_state.pt"):
        folder = tmp_path / name
        shutil.copytree(saved_run, folder)
        _spoil(folder / name, kind)
        with pytest.raises(CheckpointError, match=re.escape(str(folder / name) if kind != "tensor" else name)):
            if name == "params.pt":
                TunedLens.from_pretrained(folder, model)
            else:
                fit_tuned_lens(
                    model, _ids(model, 0), steps=2, batch_size=2, save_to=folder, resume=True, progress=False
                )
    capsys.readouterr()
    assert main(["lens", "tiny-gpt2", "The cat", "--tuned", str(tmp_path / "params.pt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "params.pt" in err


# ----------------------------------------------------------------------------
# row 19: train-lens with an lr that makes training diverge: one line naming --lr and the step, exit 2
# ----------------------------------------------------------------------------
def test_train_lens_says_in_one_line_that_lr_diverged(model: GPT, small_corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert _train(small_corpus, tmp_path / "lens", "--lr", "1e30") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.fullmatch(r"error: --lr=1e\+30: training diverged at step \d+ \(the KL is (nan|inf)\); lower --lr\n", err)
    with pytest.raises(FloatingPointError, match=r"step \d+: the KL is"):  # the library's error, as it was
        fit_tuned_lens(model, _ids(model, 0), steps=4, batch_size=2, lr=1e30, progress=False)


# ----------------------------------------------------------------------------
# row 20: train-lens on a text with no newline keeps a validation tail; a tail too short says which split
# ----------------------------------------------------------------------------
def test_train_lens_splits_a_one_line_text_and_names_a_short_split(small_corpus: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    one_line = tmp_path / "one_line.txt"
    one_line.write_text(" ".join(small_corpus.read_text(encoding="utf-8").split()))  # ~20k characters, no newline
    assert "\n" not in one_line.read_text()
    assert _train(one_line, tmp_path / "lens") == 0
    metrics = json.loads((tmp_path / "lens" / "metrics.json").read_text())
    assert metrics["validation_tokens"] > 0 and "or at a space" in metrics["validation_text"]
    capsys.readouterr()
    assert _train(one_line, tmp_path / "short", "--val-frac", "0.001", "--context-size", "128") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "validation split (the last 0.1% of each file) is too short for one window of --context-size=128" in err
    assert "--val-frac=0.001" in err


# ----------------------------------------------------------------------------
# also: a text given where a path is expected names the rule (a str is a path, a list of str is texts)
# ----------------------------------------------------------------------------
def test_a_text_given_as_data_names_the_path_rule(model: GPT) -> None:
    text = "The cat sat on the mat. " * 40  # longer than a file name may be
    rule = r"no such file or folder; a str is read as a path .* a list of str as the texts themselves"
    with pytest.raises(FileNotFoundError, match=r"data 'The cat sat on the mat\. .*\.\.\.': " + rule):
        fit_tuned_lens(model, text, steps=1, batch_size=1, context_size=16, progress=False)
    with pytest.raises(FileNotFoundError, match=rule):
        lens_kl(TunedLens.from_model(model), text, context_size=16)
    fit_tuned_lens(model, [text], steps=1, batch_size=1, context_size=16, progress=False)  # the texts themselves
