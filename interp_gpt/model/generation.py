"""Generation: the key/value cache and `generate`, offered on `GPT` through `GenerationMixin`.

>>> model.generate("The cat sat on the", max_new_tokens=5, do_sample=False)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..checks import check_float, check_int_in_range
from .text import TextMixin

if TYPE_CHECKING:
    from ..config import Config
    from ..tokenizer.bpe import Tokenizer

__all__ = ["KVCache", "rollback_on_error", "GenerationMixin"]


class KVCache:
    """Keys and values of the positions seen so far, one entry per layer, for generation.

    Each forward call with `past_kv_cache=cache` attends to the cached positions and then
    appends its own keys, values and attention mask, so the next call only feeds new tokens.
    """

    def __init__(self, n_layers: int):
        self.keys: list[Tensor | None] = [None] * n_layers  # [batch, past, n_heads, d_head]
        self.values: list[Tensor | None] = [None] * n_layers
        self.attention_mask: Tensor | None = None  # [batch, past]

    @property
    def length(self) -> int:
        return 0 if self.attention_mask is None else self.attention_mask.shape[1]

    def extend_mask(self, attention_mask: Tensor | None, tokens: Tensor) -> Tensor | None:
        """Append the new positions' mask; return the mask over every position (None if all real)."""
        new = attention_mask if attention_mask is not None else torch.ones_like(tokens)
        if self.attention_mask is not None:
            new = torch.cat([self.attention_mask, new], dim=1)
        if new.shape[0] != tokens.shape[0]:
            raise ValueError(f"past_kv_cache: holds a batch of {new.shape[0]}, input has {tokens.shape[0]}")
        self.attention_mask = new
        return None if bool(new.all()) else new

    def check(self) -> None:
        """Refuse a cache whose layers disagree with each other or with its mask."""
        lengths = {t.shape[1] for t in self.keys + self.values if t is not None}
        held = sum(k is not None for k in self.keys)
        if held not in (0, len(self.keys)) or lengths - {self.length}:
            per_layer = [None if k is None else k.shape[1] for k in self.keys]
            raise ValueError(
                f"past_kv_cache: its layers disagree (positions per layer {per_layer}, mask {self.length}); "
                "it was left half-extended: start a new KVCache"
            )

    @contextmanager
    def rollback_on_error(self) -> Iterator[None]:
        """Around a forward: if it does not complete (a hook raises, Ctrl-C), the cache is put back
        as it was, so the next call never attends to half a step."""
        self.check()
        saved = (list(self.keys), list(self.values), self.attention_mask)
        try:
            yield
        except BaseException:
            self.keys, self.values, self.attention_mask = saved
            raise

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's keys and values to layer `layer`'s and return the full ones."""
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None and past_v is not None:
            k, v = torch.cat([past_k, k], dim=1), torch.cat([past_v, v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def rollback_on_error(cache: KVCache | None) -> AbstractContextManager[None]:
    """`cache.rollback_on_error()`, or nothing to guard."""
    return nullcontext() if cache is None else cache.rollback_on_error()


class GenerationMixin(TextMixin):
    """`generate` (transformer-lens' arguments) for `GPT`; see model.py for the network."""

    if TYPE_CHECKING:  # what GPT provides
        cfg: Config
        tokenizer: Tokenizer | None

        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    @torch.no_grad()
    def generate(
        self,
        input: str | list[str] | Int[Tensor, "batch posn"],
        max_new_tokens: int = 10,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        do_sample: bool = True,
        stop_at_eos: bool = True,
        eos_token_id: int | None = None,
        use_past_kv_cache: bool = True,
        seed: int | None = None,
        prepend_bos: bool | None = None,
        return_type: Literal["input", "str", "tokens"] = "input",
        verbose: bool = False,
    ) -> Any:
        """Continue a prompt token by token; hooks fire at every step.

        `do_sample=False` is greedy decoding; otherwise tokens are sampled from the logits
        divided by `temperature`, restricted to the `top_k` most likely and/or the smallest
        set whose probability reaches `top_p`. `seed` makes sampling reproducible. With
        `use_past_kv_cache` each step feeds only the new token (same tokens, less work).
        A batch of prompts is left-padded so that every prompt ends at the last position.
        `return_type="input"` returns the kind of thing given (str, list of str, tokens).

        Example:
            >>> model.generate("The cat sat on the", max_new_tokens=5, do_sample=False, verbose=False)
            'The cat sat on the\\nsmilit'
        """
        check_int_in_range(max_new_tokens, "max_new_tokens", 0, None)
        check_float(temperature, "temperature", low=0.0 if do_sample else -math.inf)
        if top_k is not None:
            check_int_in_range(top_k, "top_k", 1, None)
        if top_p is not None:
            check_float(top_p, "top_p", low=0.0, high=1.0)
        if seed is not None:
            check_int_in_range(seed, "seed", 0, 2**64 - 1)
        for flag, value in (
            ("do_sample", do_sample),
            ("stop_at_eos", stop_at_eos),
            ("use_past_kv_cache", use_past_kv_cache),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"{flag}={value!r}: expected True or False")
        if return_type not in ("input", "str", "tokens"):
            raise ValueError(f"return_type={return_type!r}, expected 'input', 'str' or 'tokens'")
        if isinstance(input, (str, list)):
            texts = [input] if isinstance(input, str) else input
            if any(isinstance(t, str) and t == "" for t in texts) and not (
                self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
            ):
                raise ValueError("input: an empty prompt has nothing to continue (and prepend_bos is off)")
            tokens, mask = self.to_tokens(input, prepend_bos=prepend_bos, padding_side="left", return_mask=True)
        else:
            tokens = self._check_tokens(input)
            mask = torch.ones_like(tokens)
        if tokens.shape[1] + max_new_tokens > self.cfg.n_ctx:
            raise ValueError(
                f"input: a prompt of {tokens.shape[1]} tokens plus max_new_tokens={max_new_tokens} is longer "
                f"than the context of {self.cfg.n_ctx} (cfg.n_ctx)"
            )
        if eos_token_id is None and self.tokenizer is not None:
            eos_token_id = self.tokenizer.eos_token_id
        if stop_at_eos and eos_token_id is None:
            raise ValueError("stop_at_eos needs an eos_token_id (this model has no tokenizer to take it from)")
        if eos_token_id is not None:
            check_int_in_range(eos_token_id, "eos_token_id", 0, self.cfg.d_vocab - 1, "token ids")
        gen = torch.Generator(device=tokens.device)
        gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))

        cache = KVCache(self.cfg.n_layers) if use_past_kv_cache else None
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        out, step_input, step_mask = tokens, tokens, mask
        for _ in range(max_new_tokens):
            if cache is not None:
                logits = self(step_input, attention_mask=step_mask, past_kv_cache=cache)
            else:
                logits = self(out, attention_mask=None if bool(mask.all()) else mask)
            next_tok = self._sample(logits[:, -1].float(), do_sample, temperature, top_k, top_p, gen)
            if stop_at_eos and eos_token_id is not None:  # (checked above: stop_at_eos has one)
                next_tok = torch.where(finished, eos_token_id, next_tok)
                finished |= next_tok == eos_token_id
            out = torch.cat([out, next_tok[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(next_tok[:, None])], dim=1)
            step_input, step_mask = next_tok[:, None], torch.ones_like(next_tok[:, None])
            if stop_at_eos and bool(finished.all()):
                break
        if return_type == "tokens" or (return_type == "input" and isinstance(input, Tensor)):
            return out
        # Special tokens (the BOS prepended to the prompt, an EOS that ended it) are left out of the text,
        # as transformer-lens does.
        tok = self.tokenizer
        texts = [tok.decode(row[m.bool()].tolist(), skip_special_tokens=True) for row, m in zip(out, mask, strict=True)]  # type: ignore[union-attr]
        return texts[0] if isinstance(input, str) else texts

    @staticmethod
    def _sample(
        logits: Float[Tensor, "batch d_vocab"],
        do_sample: bool,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        gen: torch.Generator,
    ) -> Int[Tensor, " batch"]:
        if not do_sample:
            return logits.argmax(dim=-1)
        # Stable at any temperature > 0: the largest logit becomes 0 before the division (in float64, where a
        # temperature down to 5e-324 is not 0), so a tiny one gives -inf elsewhere, never inf - inf = nan.
        logits = (logits - logits.amax(-1, keepdim=True)).double() / temperature
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p is not None:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest set reaching top_p
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
