"""interp_gpt: a readable, hookable GPT-2 for mechanistic interpretability.

Example:
    >>> from interp_gpt import GPT
    >>> model = GPT.from_pretrained("gpt2")
    >>> logits, cache = model.run_with_cache("The cat sat on the mat")
    >>> cache["pattern", 3].shape
"""

# transformer-lens' module names: `from interp_gpt import evals, head_detector` ports unchanged.
from . import circuits  # noqa: F401 (interp_gpt.circuits: the edge graph, edge / path patching, EAP)
from . import evals as evals
from . import head_detector as head_detector
from .cache import ActivationCache
from .compare import (
    ComparisonReport,
    compare,
    compare_with_huggingface,
    compare_with_transformer_lens,
    to_transformer_lens,
    to_transformers,
)
from .config import PRESETS, Config, preset
from .factored import FactoredMatrix
from .hooks import HookedModule, HookedRootModule, HookPoint
from .loading import (
    CheckpointError,
    from_pretrained,
    from_pretrained_no_processing,
    save_hf_checkpoint,
)
from .model.gpt import GPT
from .sae import SAE, SAEConfig
from .utils import get_act_name

__all__ = [
    "GPT",
    "Config",
    "PRESETS",
    "preset",
    "HookPoint",
    "HookedRootModule",
    "HookedModule",
    "ActivationCache",
    "CheckpointError",
    "from_pretrained",
    "from_pretrained_no_processing",
    "save_hf_checkpoint",
    "get_act_name",
    "compare",
    "compare_with_transformer_lens",
    "compare_with_huggingface",
    "to_transformer_lens",
    "to_transformers",
    "ComparisonReport",
    "FactoredMatrix",
    "SAE",
    "SAEConfig",
]
__version__ = "0.1.0"
