"""`python -m interp_gpt.cli ...`: the same as the `interp-gpt` command."""

import sys

from .commands import main

__all__: list[str] = []

sys.exit(main())
