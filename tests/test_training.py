"""The training script of the shipped model: seeded, so a rerun reproduces the shipped run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from interp_gpt import from_pretrained
from interp_gpt.loading import shipped_models

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_small_model.py"
CORPUS = REPO.parent / "shared" / "data" / "corpus"


@pytest.fixture(scope="module")
def script():
    if not all((CORPUS / name).is_file() for name in ("tinyshakespeare_input.txt", "warpeace_input.txt")):
        pytest.skip(f"training corpora not found in {CORPUS} (the shared data folder)")
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
        return script.train(script.parser().parse_args(["--steps", str(steps), "--out", out, "--log-every", "0",
                                                         "--eval-batches", "1"]))
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
    cfg = record["config"]
    assert (cfg["n_layers"], cfg["d_model"], cfg["n_heads"], cfg["n_ctx"], cfg["d_vocab"]) == (
        args.layers, args.d_model, args.heads, args.ctx, args.vocab)
    assert record["steps"] == args.steps and record["batch"] == args.batch
