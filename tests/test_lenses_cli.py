"""`interp-gpt train-lens` and `interp-gpt lens --tuned` on the shipped tiny-gpt2, checked against the
library's own answers, and their bad inputs (one line, status 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interp_gpt.cli import main
from interp_gpt.cli.common import show_token
from interp_gpt.lenses import TunedLens, lens_kl, lens_windows
from interp_gpt.loading import from_pretrained
from interp_gpt.sae.data import split_corpus

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The cat sat on the mat. The cat sat on the"


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The head of tiny Shakespeare: enough text for a few steps, quick to tokenize."""
    text = (REPO / "data" / "corpus" / "tinyshakespeare_input.txt").read_text(encoding="utf-8")[:40_000]
    path = tmp_path_factory.mktemp("text") / "shakespeare.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """train-lens run once: (its --out, its exit status)."""
    out = tmp_path_factory.mktemp("lens") / "tiny"
    argv = ["train-lens", "--data", str(corpus), "--steps", "30", "--batch-size", "4", "--context-size", "32"]
    argv += ["--val-windows", "16", "--no-progress", "--out", str(out)]
    return out, main(argv)


def run(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_train_lens_saves_a_lens_and_its_held_out_kl(trained, corpus: Path, model) -> None:  # type: ignore[no-untyped-def]
    out, rc = trained
    assert rc == 0
    assert {"config.json", "params.pt", "metrics.json", "training_state.pt"} <= {p.name for p in out.iterdir()}
    metrics = json.loads((out / "metrics.json").read_text())
    kl = metrics["held_out_kl"]
    assert metrics["steps"] == 30 and metrics["train_tokens"] == 30 * 4 * 32
    assert "--steps 30" in metrics["command"] and "--lr 0.1" in metrics["command"]
    lens = TunedLens.from_pretrained(out, model)
    val = lens_windows(model, split_corpus(corpus)[1], 32)[:16]
    assert metrics["validation_tokens"] == val.numel()
    torch.testing.assert_close(torch.tensor(kl["tuned_lens"]), lens_kl(lens, val, batch_size=4), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        torch.tensor(kl["logit_lens"]), lens_kl(TunedLens.from_model(model), val, batch_size=4), atol=1e-5, rtol=1e-5
    )
    assert all(t < g for t, g in zip(kl["tuned_lens"], kl["logit_lens"], strict=True)), kl


def test_lens_tuned_prints_the_tuned_lens_top_tokens(trained, capsys, model) -> None:  # type: ignore[no-untyped-def]
    out_dir = trained[0]
    rc, out, err = run(capsys, "lens", "tiny-gpt2", PROMPT, "--tuned", str(out_dir))
    assert rc == 0, err
    assert out.startswith("tuned lens of tiny-gpt2 on ")
    lens = TunedLens.from_pretrained(out_dir, model)
    tokens = model.to_tokens(PROMPT)
    per_layer = lens.forward_all(tokens)[:, 0].softmax(-1)  # [layer, pos, d_vocab]
    probs, ids = per_layer.max(-1)
    lines = out.splitlines()
    for pos in range(tokens.shape[1]):
        expected = [f"{show_token(model.tokenizer.decode([int(ids[L, pos])]))} {probs[L, pos]:.3f}" for L in range(2)]
        assert any(line.split()[:1] == [str(pos)] and all(e in line for e in expected) for line in lines), expected
    rc, logit_out, _ = run(capsys, "lens", "tiny-gpt2", PROMPT)
    assert rc == 0 and logit_out.startswith("logit lens of") and logit_out.split("\n", 1)[1] != out.split("\n", 1)[1]


def test_lens_tuned_loads_the_model_the_way_the_lens_was_trained(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A lens trained on raw weights (ours from an unprocessed model, or tuned-lens' own, which records
    nothing) is read on the raw model; one trained on the processed model on the processed one."""
    from interp_gpt import GPT
    from interp_gpt.lenses import PROCESSING_KEY

    raw = GPT.from_pretrained_no_processing("tiny-gpt2")
    lens = TunedLens.from_model(raw)
    with torch.no_grad():
        for layer in lens:
            layer.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    lens.save(tmp_path / "raw")
    theirs = tmp_path / "theirs"  # tuned-lens' own folder: no record of the processing
    lens.save(theirs)
    config = json.loads((theirs / "config.json").read_text())
    del config[PROCESSING_KEY]
    (theirs / "config.json").write_text(json.dumps(config))
    tokens = raw.to_tokens(PROMPT)
    ids = lens.forward_all(tokens)[:, 0].argmax(-1)  # [layer, pos], read on the raw model
    for folder in (tmp_path / "raw", theirs):
        rc, out, err = run(capsys, "lens", "tiny-gpt2", PROMPT, "--tuned", str(folder))
        assert rc == 0, err
        lines = out.splitlines()
        for pos in range(tokens.shape[1]):
            words = [show_token(raw.tokenizer.decode([int(ids[L, pos])])) for L in range(2)]
            assert any(line.split()[:1] == [str(pos)] and all(w in line for w in words) for line in lines), words


def test_bad_lens_inputs_are_one_line_and_status_2(capsys, tmp_path: Path, corpus: Path) -> None:  # type: ignore[no-untyped-def]
    from interp_gpt import GPT

    cfg = GPT.from_pretrained("tiny-gpt2").cfg
    TunedLens.from_model(GPT(type(cfg)(**{**cfg.__dict__, "n_layers": 3}))).save(tmp_path / "deep")
    cases = [
        (["lens", "tiny-gpt2", PROMPT, "--tuned", str(tmp_path / "deep")], "num_hidden_layers=3 but the model"),
        (["lens", "tiny-gpt2", PROMPT, "--tuned", str(tmp_path / "nowhere")], "missing ['config.json', 'params.pt']"),
        (
            ["train-lens", "--data", str(corpus), "--steps", "0", "--out", str(tmp_path / "x")],
            "--steps=0 is out of range",
        ),
        (["train-lens", "--data", str(tmp_path / "none.txt"), "--out", str(tmp_path / "x")], "no such file or folder"),
        (
            ["train-lens", "--data", str(corpus), "--context-size", "500", "--out", str(tmp_path / "x")],
            "--context-size=500",
        ),
        (["train-lens", "--data", str(corpus), "--out", str(corpus)], "is a file; expected a folder"),
    ]
    for argv, message in cases:
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and message in err and err.count("\n") == 1 and err.startswith("error: "), (argv, err)


def test_ctrl_c_in_train_lens_says_where_the_lens_is(capsys, monkeypatch, tmp_path: Path, corpus: Path) -> None:  # type: ignore[no-untyped-def]
    from interp_gpt.lenses import train

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "fit_tuned_lens", interrupted)
    rc, _, err = run(capsys, "train-lens", "--data", str(corpus), "--out", str(tmp_path / "x"), "--no-progress")
    assert rc == 130 and "interrupted; the lens so far is in" in err and "--resume" in err
