"""`python -m interp_gpt.sae.train_transcoder_command ...`: the same as `interp-gpt train-transcoder`. Kept for
commands and imports written before the move: the command lives in `interp_gpt.sae.training.transcoder_command`."""

import sys

from .training.transcoder_command import *  # noqa: F403
from .training.transcoder_command import __all__ as __all__
from .training.transcoder_command import main

if __name__ == "__main__":
    sys.exit(main())
