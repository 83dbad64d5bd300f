"""The command line on bad input: one line on stderr naming the option or argument, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from interp_gpt.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("command", ["generate", "lens", "attention"])
def test_a_prompt_that_is_not_utf8_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, err = _run(capsys, command, "tiny-gpt2", "caf\udce9")  # b"caf\xe9" as Python reads argv
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: input: ") and "lone surrogate" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_an_out_of_range_seed_names_the_option(capsys: pytest.CaptureFixture[str], seed: str) -> None:
    code, err = _run(capsys, "generate", "tiny-gpt2", "hi", "--seed", seed)
    assert code == 2 and f"--seed must be in 0..2**64-1, got {seed}" in err


def test_non_utf8_bytes_in_a_real_argv_give_one_line_and_status_2() -> None:
    """What a shell passes for Latin-1 text: the bytes reach Python as lone surrogates."""
    done = subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"interp_gpt.cli", b"generate", b"tiny-gpt2", b"caf\xe9"],
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and "lone surrogate" in err and "Traceback" not in err


def test_a_misspelt_hook_is_one_line_with_close_names_and_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: os.PathLike[str]
) -> None:
    """A name the input gave that is not there (a KeyError inside) is one line like any bad value, its
    message unquoted; the harvest's folder is not made."""
    out = os.path.join(tmp_path, "acts")
    code, err = _run(
        capsys,
        "harvest",
        "--hook",
        "blocks.1.hook_resid_pr",
        "--data",
        "data/corpus",
        "--out",
        out,
        "--n-tokens",
        "256",
    )
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: hooks: no hook point named 'blocks.1.hook_resid_pr'; did you mean")
    assert "'blocks.1.hook_resid_pre'" in err and not os.path.exists(out)
