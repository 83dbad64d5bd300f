"""The `interp-gpt` command: every subcommand on the shipped tiny-gpt2, checked against the
library's own answers (never against exact weights or text), and every bad input."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interp_gpt.cli import commands as cli
from interp_gpt.cli import main
from interp_gpt.inspect import head_scores
from interp_gpt.loading import from_pretrained
from interp_gpt.plots import token_labels

PROMPT = "The cat sat on the mat. The cat sat on the"
SUBCOMMANDS = ["generate", "attention", "lens", "heads", "compare"]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return from_pretrained("tiny-gpt2")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`interp-gpt argv...` in-process: (exit status, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _without_bos(model, text: str) -> str:
    """`model.generate`'s text without the BOS it put in front (the command prints the user's text)."""
    return text.removeprefix(model.tokenizer.decode([model.tokenizer.bos_token_id]))


def _table_rows(out: str) -> list[str]:
    """The lines of the first table in `out`: the ones after the dashed rule, up to a blank line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+( +-+)*", line)) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


# ----------------------------------------------------------------------------
# defaults
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["compare"], ["heads"], ["generate", "hi"], ["attention", "hi"], ["lens", "hi"]])
def test_model_defaults_to_the_shipped_tiny_gpt2(argv):
    args = cli.build_parser().parse_args(argv)
    if args.command in ("generate", "attention", "lens"):
        cli._model_and_prompt(args)
        assert args.prompt == "hi"
    assert args.model == "tiny-gpt2"


def test_two_positionals_are_model_then_prompt():
    args = cli.build_parser().parse_args(["lens", "gpt2", "hi"])
    cli._model_and_prompt(args)
    assert (args.model, args.prompt) == ("gpt2", "hi")


def test_random_gpt2_small_is_still_a_model_name(monkeypatch, tmp_path):
    monkeypatch.setattr(cli, "random_gpt2_small", lambda: tmp_path)
    assert cli._resolve_model("random-gpt2-small") == tmp_path
    assert cli._resolve_model("gpt2") == "gpt2"


# ----------------------------------------------------------------------------
# generate
# ----------------------------------------------------------------------------
def test_generate_greedy_prints_what_model_generate_gives(model, capsys):
    rc, out, err = run(capsys, "generate", PROMPT, "--greedy", "--max-new-tokens", "20")
    expected = model.generate(PROMPT, max_new_tokens=20, do_sample=False)
    assert rc == 0, err
    assert out == _without_bos(model, expected) + "\n"
    assert out.startswith(PROMPT) and len(out) > len(PROMPT) + 1


def test_generate_with_model_named_gives_the_same_text(capsys):
    _, one, _ = run(capsys, "generate", PROMPT, "--greedy", "--max-new-tokens", "8")
    rc, two, err = run(capsys, "generate", "tiny-gpt2", PROMPT, "--greedy", "--max-new-tokens", "8")
    assert rc == 0, err
    assert one == two


def test_generate_sampling_is_seeded_and_equals_model_generate(model, capsys):
    flags = ["--seed", "3", "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--max-new-tokens", "15"]
    rc, first, err = run(capsys, "generate", PROMPT, *flags)
    _, second, _ = run(capsys, "generate", PROMPT, *flags)
    expected = model.generate(PROMPT, max_new_tokens=15, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    assert rc == 0, err
    assert first == second == _without_bos(model, expected) + "\n"


def test_generate_zero_new_tokens_prints_the_prompt(capsys):
    rc, out, err = run(capsys, "generate", PROMPT, "--max-new-tokens", "0")
    assert rc == 0, err
    assert out == PROMPT + "\n"


# ----------------------------------------------------------------------------
# heads
# ----------------------------------------------------------------------------
def test_heads_table_has_every_head_and_equals_head_scores(model, capsys):
    rc, out, err = run(capsys, "heads")
    assert rc == 0, err
    scores = head_scores(model)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    rows = [line.split() for line in _table_rows(out)]
    assert len(rows) == n_layers * n_heads
    assert [(int(r[0]), int(r[1])) for r in rows] == [(L, h) for L in range(n_layers) for h in range(n_heads)]
    for row in rows:
        L, h = int(row[0]), int(row[1])
        printed = [float(x) for x in row[2:]]
        assert len(printed) == len(scores)
        for value, s in zip(printed, scores.values(), strict=True):
            assert abs(value - float(s[L, h])) <= 5e-4 + 1e-6, (L, h, value, float(s[L, h]))


@pytest.mark.parametrize("top", [1, 3])
def test_heads_lists_the_top_n_heads_of_each_score(model, capsys, top):
    rc, out, err = run(capsys, "heads", "--top", str(top))
    assert rc == 0, err
    scores = head_scores(model)
    for name, s in scores.items():
        line = next(x for x in out.splitlines() if x.startswith(f"top {top} {name} heads:"))
        listed = re.findall(r"L(\d+)H(\d+) (\d\.\d{3})", line)
        assert len(listed) == top
        values = [float(v) for _, _, v in listed]
        assert values == sorted(values, reverse=True)
        assert abs(values[0] - float(s.max())) <= 5e-4 + 1e-6
        for L, h, v in listed:  # each listed head's own score
            assert abs(float(v) - float(s[int(L), int(h)])) <= 5e-4 + 1e-6


# ----------------------------------------------------------------------------
# lens
# ----------------------------------------------------------------------------
def test_lens_final_layer_at_last_position_is_the_models_top_token(model, capsys):
    rc, out, err = run(capsys, "lens", PROMPT)
    assert rc == 0, err
    str_tokens = model.to_str_tokens(PROMPT)
    header = next(line for line in out.splitlines() if line.startswith("pos"))
    assert header.split() == ["pos", "token", "0_pre", "1_pre", "final_post"]
    rows = _table_rows(out)
    assert len(rows) == len(str_tokens)
    for pos, (row, token) in enumerate(zip(rows, str_tokens, strict=True)):
        assert row.split()[0] == str(pos) and cli._show_token(token) in row
    with torch.no_grad():
        probs = model(model.to_tokens(PROMPT))[0, -1].softmax(-1)
    top = int(probs.argmax())
    label = re.escape(cli._show_token(model.tokenizer.decode_each([top])[0]))
    found = re.search(label + r" (\d\.\d{3})$", rows[-1])
    assert found, (rows[-1], model.tokenizer.decode_each([top]))
    assert abs(float(found.group(1)) - float(probs[top])) <= 1e-3


def test_lens_top_n_gives_n_lines_per_position(model, capsys):
    rc, out, err = run(capsys, "lens", "tiny-gpt2", PROMPT, "--top", "3")
    assert rc == 0, err
    rows = _table_rows(out)
    assert len(rows) == 3 * len(model.to_str_tokens(PROMPT))
    assert all(re.search(r" \d\.\d{3}$", row) for row in rows)


def test_lens_shows_newlines_visibly(capsys):
    rc, out, err = run(capsys, "lens", "KING:\nO")
    assert rc == 0, err
    assert "'\\n'" in out  # the newline token, as a literal
    assert all(re.match(r" *\d+ |  ", row) for row in _table_rows(out))  # no row broken by a raw newline


def test_show_token_cuts_long_tokens():
    assert cli._show_token(" the") == "' the'"
    assert cli._show_token("x" * 40) == "'" + "x" * 14 + "…"
    assert len(cli._show_token("x" * 40)) == 16


# ----------------------------------------------------------------------------
# attention
# ----------------------------------------------------------------------------
def test_attention_writes_one_self_contained_page(model, capsys, tmp_path):
    prompt = "The <b>cat</b> & the dog"
    page = tmp_path / "page.html"
    rc, out, err = run(capsys, "attention", prompt, "--layer", "1", "--head", "3", "--out", str(page))
    assert rc == 0, err
    assert out.strip() == str(page)
    text = page.read_text(encoding="utf-8")
    assert "plotly.js v" in text  # the library itself, inline
    assert '<script src="http' not in text
    assert "<b>cat" not in text
    for label in token_labels(model.to_str_tokens(prompt)):
        shown = html.escape(label, quote=False)
        assert json.dumps(shown) in text or json.dumps(shown, ensure_ascii=False) in text, shown
    assert '"active":1' in text and '"active":3' in text  # opened at layer 1, head 3


def test_attention_writes_attention_html_by_default(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "attention", "tiny-gpt2", "ROMEO: hello")
    assert rc == 0, err
    assert out.strip() == "attention.html"
    assert (tmp_path / "attention.html").stat().st_size > 100_000


# ----------------------------------------------------------------------------
# bad input: one line on stderr, exit status 2
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["generate", ""], "PROMPT is empty"),
        (["lens", ""], "PROMPT is empty"),
        (["attention", "tiny-gpt2", ""], "PROMPT is empty"),
        (["lens"], "PROMPT is missing"),
        (["generate", "hi", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1"),
        (["generate", "hi", "--max-new-tokens", "x"], "--max-new-tokens: invalid int value: 'x'"),
        (["generate", "word " * 200], "longer than the context of 'tiny-gpt2' (128 tokens)"),
        (["lens", "word " * 200], "longer than the context"),
        (["generate", "word " * 100, "--max-new-tokens", "60"], "use --max-new-tokens"),
        (["generate", "hi", "--temperature", "0"], "--temperature must be > 0"),
        (["generate", "hi", "--top-k", "0"], "--top-k must be >= 1"),
        (["generate", "hi", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["generate", "hi", "--greedy", "--top-k", "5"], "cannot be combined with --top-k"),
        (["attention", "hi", "--layer", "99"], "--layer 99 is out of range: 'tiny-gpt2' has layers 0.."),
        (["attention", "hi", "--head", "-1"], "--head -1 is out of range: 'tiny-gpt2' has heads 0.."),
        (["lens", "hi", "--top", "0"], "--top must be >= 1"),
        (["heads", "--top", "0"], "--top must be >= 1"),
        (["heads", "./no/such/folder"], "no file or folder at './no/such/folder'"),
        (["compare", "--against", "xx"], "--against takes tl and/or hf"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["generate", "a", "b", "c"], "unrecognized arguments: c"),
    ],
)
def test_bad_input_is_one_clear_line_and_status_2(capsys, argv, expected):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert expected in lines[0]


@pytest.mark.parametrize("command", [["generate", "hi"], ["heads"], ["lens", "hi"]])
def test_unknown_model_lists_the_known_ones(monkeypatch, tmp_path, capsys, command):
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    argv = [command[0], "no-such-gpt", *command[1:]]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "no-such-gpt" in lines[0] and "tiny-gpt2" in lines[0] and "gpt2-medium" in lines[0]
    assert "local" in lines[0] and "folder" in lines[0]  # how to point at a local copy


# ----------------------------------------------------------------------------
# help
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_subcommand_has_help_with_examples(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0
    assert "example" in out and f"interp-gpt {command}" in out
    assert "tiny-gpt2" in out  # the default model is named


def test_top_level_help_lists_every_subcommand(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for command in SUBCOMMANDS:
        assert command in out


def test_python_dash_m_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "interp_gpt.cli", "heads", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "interp-gpt heads" in done.stdout


# ----------------------------------------------------------------------------
# compare, now on tiny-gpt2 by default
# ----------------------------------------------------------------------------
@pytest.mark.parity
def test_compare_without_model_checks_tiny_gpt2(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("transformer_lens")
    rc, out, err = run(capsys, "compare")
    assert rc == 0, out + err
    assert out.startswith("model: tiny-gpt2 (2 layers")
    assert "transformer-lens" in out and "Hugging Face" in out and "all comparisons PASS" in out


@pytest.mark.slow
def test_random_gpt2_small_builds_a_gpt2_small_checkpoint(tmp_path):
    from interp_gpt import from_pretrained_no_processing

    folder = cli.random_gpt2_small(folder=tmp_path / "random")
    model = from_pretrained_no_processing(folder, tokenizer=None)
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.d_vocab, model.cfg.n_ctx) == (12, 768, 50257, 1024)
    assert model.unembed.b_U.abs().max() == 0  # GPT-2 has no unembedding bias
    assert (model.blocks[0].ln1.w - 1).abs().max() > 0.05  # noise, so fold_ln has work to do
    assert cli.random_gpt2_small(folder=folder) == folder  # built once, then reused


# ----------------------------------------------------------------------------
# a CLI without surprises (issue 28)
# ----------------------------------------------------------------------------
ALL_SUBCOMMANDS = [
    "generate", "attention", "lens", "heads", "compare", "harvest", "features", "train-sae", "train-transcoder",
    "sae-bench", "attribute", "train-lens",
]  # fmt: skip


def test_version_prints_the_package_version(capsys):
    import interp_gpt

    rc, out, _ = run(capsys, "--version")
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert rc == 0 and out == f"interp-gpt {interp_gpt.__version__}\n"
    assert f'version = "{interp_gpt.__version__}"' in pyproject


def _option_helps(help_text: str) -> dict[str, str]:
    """`--option` -> its help, joined onto one line, from a subcommand's --help output."""
    block = help_text.split("\noptions:\n", 1)[1].split("\nexamples:", 1)[0]
    entries = re.split(r"\n  (?=-)", "\n" + block)
    return {e.split()[0].rstrip(","): " ".join(e.split()) for e in entries if e.strip()}


@pytest.mark.parametrize("command", ALL_SUBCOMMANDS)
def test_every_option_of_every_subcommand_shows_its_default_in_help(capsys, command):
    rc, out, _ = run(capsys, command, "--help")
    assert rc == 0
    helps = _option_helps(out)
    assert len(helps) >= 2, out
    missing = [h for o, h in helps.items() if o != "-h" and "default" not in h and "(required)" not in h]
    assert missing == []


def test_help_shows_the_actual_default_values(capsys):
    """argparse's value, not a paraphrase: train-sae's --lr and --k, a flag as off."""
    rc, out, _ = run(capsys, "train-sae", "--help")
    helps = _option_helps(out)
    assert "(default: 0.0004)" in helps["--lr"] and "(default: 32)" in helps["--k"]
    assert "(default: off)" in helps["--no-progress"] and "(required)" in helps["--data"]


@pytest.mark.parametrize("command", ["lens", "generate", "attention"])
@pytest.mark.parametrize("name", ["tiny-gpt2", "gpt2", "GPT2-small", "random-gpt2-small"])
def test_a_model_name_alone_is_not_taken_as_the_prompt(capsys, monkeypatch, command, name):
    monkeypatch.setattr(cli, "_load", lambda name: pytest.fail(f"loaded {name}: the name was read as a prompt"))
    rc, out, err = run(capsys, command, name)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1
    assert f"{command}: PROMPT is missing: {name!r} names a model" in err
    assert f"interp-gpt {command} [MODEL] PROMPT" in err


def test_an_existing_path_alone_is_not_taken_as_the_prompt(capsys, tmp_path):
    rc, _, err = run(capsys, "lens", str(tmp_path))
    assert rc == 2 and f"PROMPT is missing: {str(tmp_path)!r} names a model" in err


def test_a_lone_prompt_that_names_no_model_is_still_the_prompt(capsys):
    rc, out, _ = run(capsys, "lens", "gpt2 is a model")
    assert rc == 0 and "logit lens of tiny-gpt2" in out


@pytest.mark.parametrize("command", ["harvest", "features", "train-sae", "train-transcoder"])
def test_data_takes_files_and_folders_several_times_in_every_command(command):
    argv = {
        "harvest": ["--hook", "h", "--out", "o", "--n-tokens", "1"],
        "features": ["tiny-gpt2", "tiny-gpt2-sae", "--feature", "1"],
        "train-sae": ["--out", "o"],
        "train-transcoder": ["--out", "o"],
    }[command]
    args = cli.build_parser().parse_args([command, *argv, "--data", "a.txt", "corpus/", "--data", "b.txt"])
    assert args.data == ["a.txt", "corpus/", "b.txt"]


@pytest.mark.parametrize("command", ["harvest", "features", "train-sae", "train-transcoder"])
def test_a_missing_data_path_is_named_the_same_way_by_every_command(capsys, tmp_path, command):
    missing = str(tmp_path / "nope.txt")
    argv = {
        "harvest": ["--hook", "blocks.0.hook_resid_pre", "--out", str(tmp_path / "o"), "--n-tokens", "128"],
        "features": ["tiny-gpt2", "tiny-gpt2-sae", "--feature", "1"],
        "train-sae": ["--out", str(tmp_path / "o")],
        "train-transcoder": ["--out", str(tmp_path / "o")],
    }[command]
    rc, _, err = run(capsys, command, *argv, "--data", missing)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"--data {missing!r}: no such file or folder" in err and "data_dir" not in err


def test_train_sae_takes_a_single_file_as_harvest_and_features_do(capsys, tmp_path):
    corpus = Path(__file__).resolve().parents[1] / "data" / "corpus" / "tinyshakespeare_input.txt"
    text = tmp_path / "shakespeare.txt"
    text.write_text(corpus.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    out = tmp_path / "sae"
    rc, _, err = run(capsys, "train-sae", "--data", str(text), "--d-sae", "64", "--k", "4", "--batch-size", "512",
                     "--n-tokens", "2048", "--val-windows", "4", "--no-progress", "--out", str(out))  # fmt: skip
    assert rc == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 4 and str(text) in metrics["validation_text"]
    assert json.loads((out / "cfg.json").read_text())["metadata"]["dataset_path"] == str(text)


def test_features_tells_that_it_needs_data_in_its_usage_line(capsys):
    rc, out, _ = run(capsys, "features", "--help")
    usage = out.split("\n\n", 1)[0]
    assert rc == 0 and "--data PATH" in usage and "[--data" not in usage
    rc, _, err = run(capsys, "features", "tiny-gpt2", "tiny-gpt2-sae", "--feature", "1")
    assert rc == 2 and "the following arguments are required: --data" in err


@pytest.mark.parity
def test_compare_fills_the_shape_column_and_prints_no_third_party_progress_bars(capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("transformer_lens")
    model = from_pretrained("tiny-gpt2")
    rc, out, err = run(capsys, "compare")
    assert rc == 0, out + err
    rows = [line for line in out.splitlines() if line.startswith(("hook_", "blocks.*.", "ln_final.", "unembed."))]
    assert len(rows) > 20 and all(re.match(r"\S+ +\d+(x\d+)+ +\d", r) for r in rows), rows  # hook, shape, diff
    n_pos = model.to_tokens(cli.DEFAULT_PROMPT).shape[1]
    embed = [r for r in rows if r.startswith("hook_embed ")]
    pattern = [r for r in rows if r.startswith("blocks.*.attn.hook_pattern ")]
    assert len(embed) == 2 and all(f" 1x{n_pos}x{model.cfg.d_model} " in r for r in embed)  # tl and hf
    assert pattern and all(f" 1x{model.cfg.n_heads}x{n_pos}x{n_pos} " in r for r in pattern)
    assert "Loading weights" not in err and "it/s" not in err and "%|" not in err
