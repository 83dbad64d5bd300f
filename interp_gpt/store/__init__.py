"""The activation store: text -> tokens -> activations at chosen hooks -> mixed batches in memory
or safetensors shards on disk (resumable, and split across torch.distributed ranks).

    >>> from interp_gpt.store import ActivationStore, load_harvest
    >>> store = ActivationStore(model, "blocks.1.hook_resid_pre", "data/corpus", context_size=128)
    >>> x = store.next_batch()                                  # [4096, d_model]
    >>> store.harvest("acts/", n_tokens=1 << 20)                 # shards + manifest.json
    >>> acts = load_harvest("acts/")["blocks.1.hook_resid_pre"]

Command line: `python -m interp_gpt.activation_store harvest --help` (or `interp-gpt harvest`).
"""

from .buffer import MixingBuffer
from .core import ActivationStore
from .harvest import harvest, iter_shards, load_harvest
from .text import TokenWindows

__all__ = ["ActivationStore", "MixingBuffer", "TokenWindows", "harvest", "iter_shards", "load_harvest"]
