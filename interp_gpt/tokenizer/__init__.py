"""Tokenizers: GPT-2's byte-level BPE (`bpe.py`), where its vocabulary files come from (`gpt2_vocab.py`),
and the tokenizer a model name implies (`by_name.py`).

Example:
    >>> from interp_gpt.tokenizer import char_tokenizer
    >>> char_tokenizer("abc").encode("cab")
    [2, 0, 1]
"""

from .bpe import ENDOFTEXT, Tokenizer, char_tokenizer, gpt2_tokenizer, saved_tokenizer, train_bpe_tokenizer
from .gpt2_vocab import GPT2_HUB_REPO, GPT2_VOCAB_ENV

__all__ = [
    "Tokenizer", "gpt2_tokenizer", "char_tokenizer", "saved_tokenizer", "train_bpe_tokenizer", "ENDOFTEXT",
    "GPT2_VOCAB_ENV", "GPT2_HUB_REPO",
]  # fmt: skip
