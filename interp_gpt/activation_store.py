"""`python -m interp_gpt.activation_store harvest ...`: the harvest command, which lives in
`interp_gpt.store.command`; this path keeps working for commands and imports written before the move."""

import sys

from .store import ActivationStore, MixingBuffer, TokenWindows, harvest, iter_shards, load_harvest
from .store.command import add_arguments, main, run

__all__ = [
    "ActivationStore", "MixingBuffer", "TokenWindows", "harvest", "iter_shards", "load_harvest", "main",
    "add_arguments", "run",
]  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
