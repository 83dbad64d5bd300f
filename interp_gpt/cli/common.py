"""What the `interp-gpt` subcommands share: the help format (every option's default shown), the one
`--data` rule, and plain-text tables.

The subcommands whose options live beside their library (harvest in `activation_store`, features,
train-sae and train-transcoder in `sae`, attribute in `attribution`) import from here, so this module
imports nothing from `interp_gpt` but `checks`.

Example:
    >>> p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    >>> add_data_argument(p, "the text to read")
    >>> p.parse_args(["--data", "a.txt", "more/", "--data", "b.txt"]).data
    ['a.txt', 'more/', 'b.txt']
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = [
    "DATA_RULE", "HelpFormatter", "UsageError", "add_data_argument", "check_at_least", "check_index_option",
    "show_token", "table",
]  # fmt: skip

DATA_RULE = "a text file or a folder of .txt files; several after one --data, or --data again"


class UsageError(ValueError):
    """A bad command-line argument; `interp-gpt` prints it as one line and exits with status 2."""


def check_index_option(value: int, size: int, option: str, what: str) -> int:
    """`value` as an index 0..size-1 of an option such as --layer, or a UsageError.

    Example: `check_index_option(2, 2, "--layer", "'tiny-gpt2' has layers")` raises
    "--layer 2 is out of range: 'tiny-gpt2' has layers 0..1".
    """
    if not 0 <= value < size:
        raise UsageError(f"{option} {value} is out of range: {what} 0..{size - 1}")
    return value


def check_at_least(value: int | float | None, low: int | float, option: str) -> None:
    """A UsageError unless `value` (when given) is at least `low`: "--top must be >= 1, got 0"."""
    if value is not None and value < low:
        raise UsageError(f"{option} must be >= {low}, got {value}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description and examples as written; every option's help ends with its default.

    A help that already says its default (the word "default" in it) is left as it is; a flag says
    "(default: off)"; an option with no default is marked "(required)" when it is; any other gets
    argparse's "(default: VALUE)". An option whose default is None must say in words what happens
    without it (tests/test_cli.py checks every subcommand's help)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if "default" in help or not action.option_strings or action.default is argparse.SUPPRESS:
            return help
        if action.nargs == 0 and action.default is False:  # store_true
            return f"{help} (default: off)".strip()
        if action.required:
            return f"{help} (required)".strip()
        if action.default is None:
            return help
        return f"{help} (default: %(default)s)".strip()


def add_data_argument(p: argparse.ArgumentParser, what: str, option: str = "--data") -> None:
    """A required `--data PATH [PATH ...]` (repeatable) that every command reads by one rule:
    `checks.check_text_files`. `what` says what the command does with the text."""
    p.add_argument(option, action="extend", nargs="+", required=True, metavar="PATH", help=f"{what}: {DATA_RULE}")


def show_token(token: str, width: int = 16) -> str:
    """A token as a short, visible label: its repr (quotes show spaces, "\\n" newlines),
    cut to `width` characters with "…".

    Example: `show_token(" the")` -> "' the'"; `show_token("\\n")` -> "'\\\\n'".
    """
    shown = repr(token)
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def table(header: list[str], rows: list[list[str]], right: frozenset[int] = frozenset()) -> str:
    """Plain-text columns: a header, a rule, then the rows; columns in `right` right-aligned.

    Example: `table(["a", "b"], [["x", "1.0"]], right=frozenset({1}))` -> "a    b\\n-  ---\\nx  1.0".
    """
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def quiet_third_party_progress() -> Any:
    """A context in which transformers' and huggingface_hub's progress bars (weights loading,
    downloads) stay off, so a command's own output is not mixed with them; restored on exit."""
    import contextlib
    import os

    @contextlib.contextmanager
    def quiet() -> Any:
        saved = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        undo: list[Any] = []  # the functions that turn them back on
        try:
            try:
                from huggingface_hub.utils import (
                    are_progress_bars_disabled,
                    disable_progress_bars,
                    enable_progress_bars,
                )

                if not are_progress_bars_disabled():
                    disable_progress_bars()
                    undo.append(enable_progress_bars)
            except ImportError:
                pass
            try:
                from transformers.utils import logging as hf_logging

                if hf_logging.is_progress_bar_enabled():
                    hf_logging.disable_progress_bar()
                    undo.append(hf_logging.enable_progress_bar)
            except ImportError:
                pass
            yield
        finally:
            for fn in undo:
                fn()
            if saved is None:
                os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
            else:
                os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = saved

    return quiet()
