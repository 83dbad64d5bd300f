"""A 2-layer model whose heads are set by hand, so that the inspection tools (`inspect.py`)
and the pictures (`plots`) can be checked against known answers.

`planted_heads_model` is also offered as `interp_gpt.inspect.planted_heads_model`.
"""

from __future__ import annotations

from typing import cast

import torch

from .config import Config
from .model.gpt import GPT, Attention, TransformerBlock

__all__ = ["planted_heads_model", "PLANTED_ALPHABET"]

PLANTED_ALPHABET = "abcdefghijklmno"  # 15 characters; "<|endoftext|>" (id 15) is the 16th token

# The residual stream's one-hot slots: where each one starts.
POS, TOK, PREV, PRED = 0, 32, 48, 64
GAIN = 2.0  # query and key gains: attention scores of about 20 where the pattern is wanted


def _head(model: GPT, layer: int, head: int) -> Attention:
    """Layer `layer`'s attention, with head `head`'s W_Q, W_K and W_V cleared for planting."""
    attn = cast(TransformerBlock, model.blocks[layer]).attn
    for W in (attn.W_Q, attn.W_K, attn.W_V):
        W[head] = 0.0
    return attn


@torch.no_grad()
def planted_heads_model(seed: int = 0) -> GPT:
    """A 2-layer model whose heads are set by hand, for checking inspection tools.

    - L0H0 is a previous-token head, L0H1 a duplicate-token head, L1H0 an induction head
      that copies the token it attends to into the logits (so the model predicts the
      second half of a repeated sequence); the other heads have small random weights.
    - The residual stream (d_model 128) has one-hot slots: dims 0-31 the position,
      32-47 the token, 48-63 the previous token (written by L0H0), 64-79 the prediction
      (written by L1H0); the MLPs are zero.
    - It carries a character tokenizer over "abcdefghijklmno" (+ "<|endoftext|>" = BOS).

    Example:
        >>> from interp_gpt.inspect import head_scores
        >>> model = planted_heads_model()
        >>> scores = head_scores(model, seq_len=12)
        >>> int(scores["induction"].argmax())        # layer 1, head 0
        4
    """
    from .tokenizer.bpe import char_tokenizer  # the tokenizers library loads only when asked for

    n_vocab, n_ctx = len(PLANTED_ALPHABET) + 1, 32
    cfg = Config(
        n_layers=2,
        d_model=128,
        n_heads=4,
        d_head=48,
        d_mlp=64,
        d_vocab=n_vocab,
        n_ctx=n_ctx,
        model_name="planted-heads",
    )
    model = GPT(cfg, tokenizer=char_tokenizer(PLANTED_ALPHABET, name="planted"))
    model.init_weights(seed=seed)
    for name, p in model.named_parameters():  # start from nothing but the random heads
        if not name.startswith("blocks.") or ".mlp." in name or name.endswith(("W_O", "b_O")):
            p.zero_()
    for name, p in model.named_parameters():  # every LayerNorm's scale is 1
        if name.endswith(".w"):
            p.fill_(1.0)
    positions, tokens = torch.arange(n_ctx), torch.arange(n_vocab)
    model.pos_embed.W_pos[positions, POS + positions] = 1.0
    model.embed.W_E[tokens, TOK + tokens] = 1.0

    prev = _head(model, 0, 0)  # the query at i matches the key at j = i - 1 ...
    prev.W_Q[0, POS + positions, positions] = GAIN
    prev.W_K[0, POS + positions[:-1], positions[:-1] + 1] = GAIN
    prev.W_V[0, TOK + tokens, tokens] = 1.0  # ... and copies that token into the PREV slot
    prev.W_O[0, tokens, PREV + tokens] = 1.0 / 8  # the normalised spike is ~8; back to ~1

    dup = _head(model, 0, 1)  # same token (+1), same position (-1): earlier copies
    dup.W_Q[1, TOK + tokens, tokens] = GAIN
    dup.W_K[1, TOK + tokens, tokens] = GAIN
    dup.W_Q[1, POS + positions, 16 + positions] = GAIN
    dup.W_K[1, POS + positions, 16 + positions] = -GAIN

    ind = _head(model, 1, 0)  # query token == the key's previous token
    ind.W_Q[0, TOK + tokens, tokens] = GAIN
    ind.W_K[0, PREV + tokens, tokens] = GAIN
    ind.W_V[0, TOK + tokens, tokens] = 1.0  # copies the attended token ...
    ind.W_O[0, tokens, PRED + tokens] = 1.0 / 6  # ... into the PRED slot
    model.unembed.W_U[PRED + tokens, tokens] = 3.0
    return model.eval()
