"""transformer-lens 4.x's TransformerBridge around a random Hugging Face GPT-2, booted offline: the one
way the parity tests build it (tests import it with `sys.path.insert(0, <tests dir>)`)."""

from __future__ import annotations

import copy
from typing import Any


def word_level_bridge(hf: Any, name: str, *, compatibility: bool = True, processed: bool = False) -> Any:
    """A bridge around a copy of `hf` (the bridge rewrites the model it wraps). It insists on a tokenizer;
    a word-level vocabulary of `hf`'s size ("t7" is id 7, the last id BOS, EOS and padding) will do, and
    lets both libraries read the same ids from text. `name` goes into the tokenizer's `name_or_path`,
    which the bridge reads (without it, or without `add_bos_token`, it reloads the tokenizer from the
    hub). `compatibility`: transformer-lens' legacy hook names (`enable_compatibility_mode`), with its
    weight processing if `processed`; False: the raw bridge."""
    import tokenizers
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    n = hf.config.vocab_size
    vocab = {f"t{i}": i for i in range(n - 1)} | {"<|endoftext|>": n - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        add_bos_token=True,
    )
    tok.init_kwargs["name_or_path"] = name
    bridge = TransformerBridge.boot_transformers(name, hf_model=copy.deepcopy(hf), tokenizer=tok, device="cpu").eval()
    if compatibility:
        bridge.enable_compatibility_mode(disable_warnings=True, no_processing=not processed)
    return bridge
