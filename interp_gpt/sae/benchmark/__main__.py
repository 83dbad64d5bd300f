"""`python -m interp_gpt.sae.benchmark ...`: the sae-bench command (see command.py)."""

import sys

from .command import main

__all__: list[str] = []

sys.exit(main())
