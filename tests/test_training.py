"""The training script of the shipped model: seeded, so a rerun reproduces the shipped run."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, from_pretrained, from_pretrained_no_processing
from interp_gpt.loading import shipped_models

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_small_model.py"
DATA = REPO / "data"
CORPUS = DATA / "corpus"
# The two corpora and their sizes in bytes, as data/README.md describes them.
CORPORA = {"tinyshakespeare_input.txt": 1_115_394, "warpeace_input.txt": 3_266_296}
PREVIOUS_TOKEN_BAR = 0.5


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_small_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped():
    folder = shipped_models()["tiny-gpt2"]
    return folder, json.loads((folder / "training.json").read_text())


def _run(script, steps: int, out: str = "") -> dict:
    before = torch.get_num_threads()
    try:
        return script.train(
            script.parser().parse_args(
                ["--max-steps", str(steps), "--out", out, "--log-every", "0", "--eval-batches", "1"]
            )
        )
    finally:
        torch.set_num_threads(before)


def test_rerun_with_the_same_seed_gives_the_same_losses(script):
    first, second = _run(script, 3), _run(script, 3)
    assert len(first["losses_first"]) == 3
    assert first["losses_first"] == pytest.approx(second["losses_first"], abs=1e-6, rel=0)


def test_rerun_reproduces_the_shipped_models_first_losses(script, shipped):
    """The README's training command made the shipped weights: its first steps come back."""
    _, record = shipped
    rerun = _run(script, 5)
    assert record["seed"] == 0 and len(record["losses_first"]) == 5
    assert rerun["losses_first"] == pytest.approx(record["losses_first"], abs=1e-6, rel=0)


def test_the_tokenizer_trains_to_the_shipped_one(script, shipped):
    folder, _ = shipped
    texts = script.load_corpus(CORPUS)
    tok = script.train_bpe_tokenizer(texts, 2048, name=script.NAME)
    shipped_tok = from_pretrained(folder).tokenizer
    sample = texts[0][:2000] + texts[1][-2000:]
    assert tok.vocab_size == shipped_tok.vocab_size == 2048
    assert tok.encode(sample) == shipped_tok.encode(sample)


def test_the_shipped_config_is_what_the_script_trains(script, shipped):
    _, record = shipped
    args = script.parser().parse_args([])
    stages = script.parse_stages(args.stages)
    cfg = record["config"]
    assert (cfg["n_layers"], cfg["d_model"], cfg["n_heads"], cfg["n_ctx"], cfg["d_vocab"]) == (
        args.layers,
        args.d_model,
        args.heads,
        stages[-1][0],
        args.vocab,
    )
    assert record["stages"] == args.stages and record["steps"] == sum(steps for _, steps in stages)
    assert (record["batch"], record["lr"], record["random_frac"], record["passage_frac"]) == (
        args.batch,
        args.lr,
        args.random_frac,
        args.passage_frac,
    )


def test_a_quick_run_stops_at_max_steps_and_saves_a_loadable_model(script, tmp_path):
    summary = _run(script, 2, out=str(tmp_path / "m"))
    assert summary["steps"] == 2 and len(summary["losses_first"]) == 2
    model = from_pretrained_no_processing(tmp_path / "m")
    # The unembedding was tied to the embedding while training: the saved W_U is W_E^T.
    torch.testing.assert_close(model.W_U, model.W_E.T, rtol=0, atol=0)
    assert model.cfg.n_ctx == 128 and model.tokenizer.vocab_size == 2048


# ----------------------------------------------------------------------------
# the corpora ship in the repo and are checked before training
# ----------------------------------------------------------------------------
def test_the_sha256_list_matches_the_corpora_in_the_repo():
    listed = {}
    for line in (DATA / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, path = line.split("  ")
        listed[path] = digest
    assert sorted(listed) == sorted(f"corpus/{name}" for name in CORPORA)
    for path, digest in listed.items():
        content = (DATA / path).read_bytes()
        assert hashlib.sha256(content).hexdigest() == digest, path
        assert len(content) == CORPORA[Path(path).name], path


def test_the_script_reads_the_repos_corpora_by_default(script):
    assert Path(script.parser().parse_args([]).data) == CORPUS
    assert Path(script.SHA256SUMS) == DATA / "SHA256SUMS"


def test_a_missing_or_changed_corpus_file_is_a_clear_error(script, tmp_path):
    shutil.copyfile(CORPUS / "tinyshakespeare_input.txt", tmp_path / "tinyshakespeare_input.txt")
    with pytest.raises(FileNotFoundError, match=r"corpus file .*warpeace_input\.txt not found"):
        script.load_corpus(tmp_path)
    original = (CORPUS / "warpeace_input.txt").read_bytes()
    (tmp_path / "warpeace_input.txt").write_bytes(original.replace(b"\r\n", b"\n"))  # what a CRLF -> LF checkout does
    with pytest.raises(ValueError, match=r"warpeace_input\.txt has sha256 [0-9a-f]{64}, but .*SHA256SUMS expects"):
        script.load_corpus(tmp_path)


def test_the_script_run_from_the_command_line_trains_and_saves_a_loadable_model(tmp_path):
    """A fresh clone's `python scripts/train_small_model.py`, cut to 2 steps of a small model."""
    shipped_weights = shipped_models()["tiny-gpt2"] / "model.safetensors"
    shipped_before = hashlib.sha256(shipped_weights.read_bytes()).hexdigest()
    out = tmp_path / "model"
    small = ["--vocab", "1024", "--stages", "128:2", "--batch", "2", "--d-model", "32", "--heads", "2"]
    quick = ["--max-steps", "2", "--log-every", "0", "--eval-batches", "1", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), *small, *quick],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # the default corpus folder is found from the script, not the working folder
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"in {CORPUS}, sha256 as in SHA256SUMS" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1])["steps"] == 2

    model = GPT.from_pretrained(out)
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_ctx, model.cfg.d_vocab) == (2, 32, 128, 1024)
    logits = model("To be, or not to be: that is the question.")
    assert logits.shape[-1] == 1024 and bool(torch.isfinite(logits).all())
    assert hashlib.sha256(shipped_weights.read_bytes()).hexdigest() == shipped_before  # --out was honoured


@pytest.mark.parametrize("text", ["", "32", "32:10,x:5", "2:10", "32:-1"])
def test_bad_stages_are_a_clear_error(script, text):
    with pytest.raises(ValueError, match="--stages: expected 'CTX:STEPS"):
        script.parse_stages(text)


def test_batch_rows_start_with_end_of_text_and_repeat_what_they_say(script):
    data = [torch.arange(1000, dtype=torch.int16) % 500]
    gen = torch.Generator().manual_seed(0)
    rows = script.batch(data, 64, 32, gen, bos=2047, random_frac=1.0)
    assert rows.shape == (64, 32) and bool((rows[:, 0] == 2047).all())
    for row in rows[:, 1:]:  # h random ids, the same h again: some h in [2, 15] fits
        assert any(bool((row[:h] == row[h : 2 * h]).all()) for h in range(2, 16))
        assert int(row.max()) < 2047
    plain = script.batch(data, 8, 32, torch.Generator().manual_seed(0), bos=2047)
    assert bool((plain[:, 2:] - plain[:, 1:-1] == 1).logical_or(plain[:, 2:] == 0).all())  # consecutive text


# ----------------------------------------------------------------------------
# what the shipped model learned
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped_scores():
    from interp_gpt.inspect import head_scores

    model = from_pretrained("tiny-gpt2")
    return model, head_scores(model, seq_len=50, batch_size=16)


def test_the_shipped_model_has_an_induction_head(shipped_scores):
    """The issue's bar: induction score >= 0.5 on repeated random tokens, by head_scores.

    An induction head needs a head before it that moves each token's identity one position
    on, so it sits in layer 1 of this 2-layer model.
    """
    _, scores = shipped_scores
    induction = scores["induction"]
    assert float(induction.max()) >= 0.5, induction
    layer, _ = divmod(int(induction.argmax()), induction.shape[1])
    assert layer == 1
    assert float(induction[0].max()) < 0.2  # layer 0 cannot do it: it sees no earlier layer


def test_the_shipped_model_has_a_previous_token_head_in_layer_0(shipped_scores):
    _, scores = shipped_scores
    prev = scores["previous token"]
    assert float(prev[0].max()) >= PREVIOUS_TOKEN_BAR, prev
    # far above a head that spreads its attention evenly (1/position on average, ~0.1 here)
    assert float(prev[0].max()) >= 3 * float(prev[0].median())


def test_the_shipped_model_predicts_the_second_half_of_a_repeated_sequence(shipped_scores):
    """In-context copying shows in the loss: the repeat costs far less than the first half."""
    from interp_gpt.inspect import repeated_tokens

    model, _ = shipped_scores
    tokens = repeated_tokens(model, seq_len=50, batch_size=16, seed=1)
    with torch.no_grad():
        loss = model(tokens, return_type="loss", loss_per_token=True)  # [batch, pos - 1]
    first, second = loss[:, 1:50].mean(), loss[:, 51:].mean()  # predicting tokens 2..50, 52..100
    assert float(first) > 6.0  # random tokens: close to log(2047) = 7.6, nothing to predict them by
    assert float(second) < 0.5 * float(first), (float(first), float(second))


def test_the_training_record_holds_the_shipped_models_scores(shipped, shipped_scores):
    _, record = shipped
    model, _ = shipped_scores
    from interp_gpt.inspect import head_scores

    scores = head_scores(model)  # as the script measures them at the end
    assert record["best_induction_score"] == pytest.approx(float(scores["induction"].max()), abs=1e-3)
    assert record["best_previous_token_score"] == pytest.approx(float(scores["previous token"].max()), abs=1e-3)
