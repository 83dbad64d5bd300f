"""`python -m interp_gpt.sae.training ...`: the same as `interp-gpt train-sae`."""

import sys

from .sae_command import main

__all__: list[str] = []

sys.exit(main())
