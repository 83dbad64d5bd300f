"""The `interp-gpt` command: its entry point (`commands.py`) and what the subcommands share (`common.py`).

Each analysis package keeps its own command module beside its library (`store/command.py`,
`sae/training/sae_command.py`, `attribution/command.py`, `lenses/command.py`, ...); `commands.py`
gathers them into one parser.

    interp-gpt --help
    python -m interp_gpt.cli generate --model tiny-gpt2 "Once upon a time"
"""

from .commands import DEFAULT_MODEL, DEFAULT_PROMPT, RANDOM_MODEL, build_parser, main, random_gpt2_small
from .common import HelpFormatter, UsageError, quiet_third_party_progress

__all__ = [
    "main", "build_parser", "random_gpt2_small", "DEFAULT_MODEL", "DEFAULT_PROMPT", "RANDOM_MODEL", "HelpFormatter",
    "UsageError", "quiet_third_party_progress",
]  # fmt: skip
