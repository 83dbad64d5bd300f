"""Kept for imports written before the move: the training data lives in `interp_gpt.sae.training.data`."""

from .training.data import *  # noqa: F403
from .training.data import __all__ as __all__
