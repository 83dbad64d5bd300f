"""Tokenizer conveniences with transformer-lens' names, offered on `GPT` through `TextMixin`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from jaxtyping import Int
from torch import Tensor

from .checks import check_mask, check_tokens

if TYPE_CHECKING:
    from .config import Config
    from .tokenizer import Tokenizer


class TextMixin:
    """`to_tokens`, `to_str_tokens`, `to_string`, `to_single_token` for `GPT`."""

    if TYPE_CHECKING:  # what GPT provides
        cfg: Config
        tokenizer: Tokenizer | None

        @property
        def W_E(self) -> Tensor: ...

    # Input checks (checks.py) on the model's own numbers and device; patching and compare use them too.
    def _check_tokens(self, tokens: Any, past_len: int = 0, arg: str = "input") -> Int[Tensor, "batch posn"]:
        expected = "a string, a list of strings or a tensor of token ids"
        return check_tokens(tokens, self.cfg.d_vocab, self.cfg.n_ctx, arg, past_len, expected=expected).to(
            self.W_E.device
        )

    def _check_mask(self, attention_mask: Any, like: Tensor) -> Int[Tensor, "batch posn"]:
        return check_mask(attention_mask, tuple(like.shape[:2])).to(self.W_E.device)

    def _tokens_and_mask(
        self,
        input: Any,
        prepend_bos: bool | None,
        padding_side: Literal["left", "right"] | None,
        attention_mask: Any,
        past_len: int = 0,
    ) -> tuple[Int[Tensor, "batch posn"], Int[Tensor, "batch posn"] | None]:
        """A forward's input (text or token ids) as checked token ids, and its attention mask
        (the one given, checked; else the padding's, or None when nothing is padded)."""
        if isinstance(input, (str, list)):
            tokens, mask = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side, return_mask=True)
            if attention_mask is None and not bool(mask.all()):
                attention_mask = mask
        else:
            tokens = self._check_tokens(input, past_len=past_len)
        if attention_mask is not None:
            attention_mask = self._check_mask(attention_mask, tokens)
        return tokens, attention_mask

    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(
                "this model has no tokenizer: pass token ids, or set model.tokenizer "
                "(e.g. interp_gpt.tokenizer.gpt2_tokenizer())"
            )
        return self.tokenizer

    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        move_to_device: bool = True,
        return_mask: bool = False,
    ) -> Any:
        """Token ids `[batch, posn]` for a string or a list of strings (padded).

        `prepend_bos` defaults to `cfg.default_prepend_bos` (True for GPT-2, as in
        transformer-lens). With `return_mask`, also returns the attention mask.

        Example:
            >>> model.to_tokens("Hello world", prepend_bos=False)
            tensor([[15496,   995]])
        """
        tok = self._require_tokenizer()
        if isinstance(input, str):
            input = [input]
        elif not isinstance(input, list):
            raise TypeError(f"input: expected a string or a list of strings, got {type(input).__name__}")
        bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        tokens, mask = tok.to_tokens(
            input, prepend_bos=bos, padding_side=padding_side or "right", max_length=self.cfg.n_ctx
        )
        if move_to_device:
            tokens, mask = tokens.to(self.W_E.device), mask.to(self.W_E.device)
        return (tokens, mask) if return_mask else tokens

    def to_str_tokens(self, input: str | Tensor | list[int], prepend_bos: bool | None = None) -> list[str]:
        """One string per token, e.g. `["<|endoftext|>", "Hello", " world"]`."""
        tok = self._require_tokenizer()
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos=prepend_bos, move_to_device=False)[0].tolist()
        elif isinstance(input, Tensor):
            if input.ndim == 2 and input.shape[0] == 1:
                input = input[0]
            if input.ndim != 1:
                raise ValueError(f"input: to_str_tokens takes one sequence, got shape {tuple(input.shape)}")
            ids = input.tolist()
        else:
            ids = list(input)
        return tok.decode_each(ids)

    def to_string(self, tokens: Tensor | list[int]) -> str | list[str]:
        """Decode token ids: `[posn]` to a string, `[batch, posn]` to a list of strings."""
        tok = self._require_tokenizer()
        if isinstance(tokens, Tensor) and tokens.ndim == 2:
            return [tok.decode(row.tolist()) for row in tokens]
        return tok.decode(tokens.tolist() if isinstance(tokens, Tensor) else list(tokens))

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id, e.g. `262` -> `" the"` (transformer-lens' name)."""
        if isinstance(int_token, bool) or not isinstance(int_token, int):
            raise TypeError(f"to_single_str_token: int_token must be an int, got {type(int_token).__name__}")
        return self.to_str_tokens([int_token])[0]

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token, e.g. `" the"` -> 262."""
        ids = self._require_tokenizer().encode(string)
        if len(ids) != 1:
            raise ValueError(f"to_single_token: {string!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]
