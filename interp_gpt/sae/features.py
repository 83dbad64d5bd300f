"""Kept for imports written before the move: the feature pages live in `interp_gpt.sae.saes.features`."""

from .saes.features import *  # noqa: F403
from .saes.features import __all__ as __all__
