"""The network and GPT's methods.

`gpt.py` is the network, read top to bottom in one sitting: Embed, PosEmbed, LayerNorm, Attention,
MLP, TransformerBlock, Unembed, and GPT's `__init__` / `forward`. GPT's other methods live beside it,
one job a file, each a mixin that `GPT` inherits:

    hooked.py            hook points, run_with_hooks / run_with_cache, device and dtype tracking
    weights.py           weight processing on a loaded model (fold_ln, centring, refactoring)
    pretrained.py        GPT.from_pretrained and its variants
    text.py, generation.py   tokens <-> text, loss, generate with a key/value cache
    stacked.py           TL's stacked weight views (W_Q ... W_U as [layer, ...] tensors, OV / QK circuits)
    splicing.py          splicing SAEs and transcoders into hook points
    activations.py, attention_blocks.py   GELUs and the attention's query blocks

Example:
    >>> from interp_gpt.model import GPT
    >>> model = GPT.from_pretrained("tiny-gpt2")
    >>> model("Hello").shape[-1] == model.cfg.d_vocab
    True
"""

from ..checks import check_layer, check_resid
from ..config import Config
from ..factored import FactoredMatrix
from ..hooks import HookPoint, explicit_paths
from ..tokenizer.by_name import tokenizer_by_name
from ..utils import lm_cross_entropy_loss
from .activations import ACTIVATIONS, IN_PLACE, add_bias, gelu_fast, gelu_new, unembed_in_slices
from .generation import GenerationMixin, KVCache, rollback_on_error
from .gpt import (
    GPT,
    MLP,
    Attention,
    Embed,
    LayerNorm,
    NoNorm,
    PosEmbed,
    TransformerBlock,
    Unembed,
    make_norm,
)
from .hooked import HookedGPT
from .pretrained import PretrainedMixin
from .splicing import SplicingMixin
from .stacked import StackedWeightsMixin
from .text import TextMixin
from .weights import ProcessingMixin

__all__ = [
    # the network (gpt.py)
    "GPT", "Embed", "PosEmbed", "LayerNorm", "NoNorm", "make_norm", "Attention", "MLP", "TransformerBlock",
    "Unembed",
    # GPT's methods, one mixin a file
    "HookedGPT", "ProcessingMixin", "PretrainedMixin", "TextMixin", "GenerationMixin", "StackedWeightsMixin",
    "SplicingMixin", "KVCache", "rollback_on_error",
    # the pieces the network is made of, importable from here as before
    "ACTIVATIONS", "IN_PLACE", "add_bias", "gelu_fast", "gelu_new", "unembed_in_slices", "Config",
    "FactoredMatrix", "HookPoint", "explicit_paths", "check_layer", "check_resid", "lm_cross_entropy_loss",
    "tokenizer_by_name",
]  # fmt: skip
