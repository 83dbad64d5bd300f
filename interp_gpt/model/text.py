"""Tokenizer conveniences with transformer-lens' names, offered on `GPT` through `TextMixin`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from ..checks import check_integer_tensor, check_mask, check_tokens
from ..utils import lm_cross_entropy_loss

if TYPE_CHECKING:
    from ..config import Config
    from ..tokenizer.bpe import Tokenizer

__all__ = ["TextMixin"]


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
            >>> model.to_tokens("Hello world", prepend_bos=False)   # tiny-gpt2's 2,048-token vocabulary
            tensor([[  39,  446,   78, 1209]])
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

    def to_str_tokens(
        self,
        input: str | list | Tensor | np.ndarray,
        prepend_bos: bool | None = None,
        *,
        padding_side: Literal["left", "right"] | None = None,
    ) -> list[str] | list[list[str]]:
        """One string per token, e.g. `["<|endoftext|>", "Hello", " world"]`, as transformer-lens.

        `input`: a string (tokenized with `prepend_bos` / `padding_side`), token ids (a 1-D tensor or
        numpy array, or one with size-1 axes, which are squeezed; a list of ints), or a list of any
        of these (a list of lists back). A 2-D batch of ids gives one list per row (transformer-lens
        refuses it).

        Example:
            >>> model.to_str_tokens("Hello world")        # tiny-gpt2's small vocabulary splits "Hello"
            ['<|endoftext|>', 'H', 'ell', 'o', ' world']
            >>> model.to_str_tokens(["Hi", "Hello world"], prepend_bos=False)
            [['H', 'i'], ['H', 'ell', 'o', ' world']]
        """
        tok = self._require_tokenizer()
        if isinstance(input, list):
            if input and all(_is_int(i) for i in input):
                return tok.decode_each([int(i) for i in input])
            return [self.to_str_tokens(item, prepend_bos, padding_side=padding_side) for item in input]  # type: ignore[return-value]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side, move_to_device=False)[0]
            return tok.decode_each(ids.tolist())
        if isinstance(input, np.ndarray):
            if input.dtype.kind not in "iu":
                raise TypeError(f"to_str_tokens: input must hold integer token ids, got a numpy array of {input.dtype}")
            input = torch.from_numpy(input)
        if not isinstance(input, Tensor):
            raise TypeError(
                "to_str_tokens: input must be a string, a list (of strings, ints or token sequences), "
                f"or a tensor / numpy array of token ids; got {type(input).__name__}"
            )
        ids = input.squeeze()  # as transformer-lens: [1, pos] and [pos, 1] are one sequence
        if ids.ndim == 0:
            ids = ids.reshape(1)
        if ids.ndim == 2:
            return [tok.decode_each(row) for row in ids]
        if ids.ndim != 1:
            raise ValueError(
                f"to_str_tokens: input must be [pos] or [batch, pos] token ids, got shape {tuple(input.shape)}"
            )
        return tok.decode_each(ids)

    def loss_fn(
        self,
        logits: Tensor,
        tokens: Tensor,
        attention_mask: Tensor | None = None,
        per_token: bool = False,
    ) -> Tensor:
        """Next-token cross-entropy of `logits` [batch, posn, d_vocab] on `tokens` [batch, posn], as
        transformer-lens' `model.loss_fn` (what `forward(return_type="loss")` returns): the mean, or with
        `per_token` one loss per position [batch, posn - 1]; where `attention_mask` is 0 (padding) a position
        neither predicts nor is predicted (its per-token loss is 0 and the mean leaves it out).

        Example:
            >>> model = GPT.from_pretrained("tiny-gpt2")
            >>> tokens = model.to_tokens("the cat sat")
            >>> torch.equal(model.loss_fn(model(tokens), tokens), model(tokens, return_type="loss"))
            True
        """
        for arg, t in (("logits", logits), ("tokens", tokens)):
            if not isinstance(t, Tensor):
                raise TypeError(f"loss_fn: {arg} must be a tensor, got {type(t).__name__}")
        if logits.ndim != 3 or tokens.shape != logits.shape[:2]:
            raise ValueError(
                f"loss_fn: logits must be [batch, posn, d_vocab] and tokens [batch, posn] with the same batch and posn, "
                f"got logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)}"
            )
        tokens = check_integer_tensor(tokens, "tokens").to(logits.device)
        if attention_mask is not None:
            attention_mask = check_mask(attention_mask, tuple(tokens.shape)).to(logits.device)
        return lm_cross_entropy_loss(logits, tokens, attention_mask, per_token=bool(per_token))

    def to_string(self, tokens: Tensor | list[int] | int) -> str | list[str]:
        """Decode token ids: one id (an int or a 0-d tensor) or `[posn]` to a string, `[batch, posn]`
        to a list of strings, as transformer-lens' `to_string`.

        Example:
            >>> model = GPT.from_pretrained("tiny-gpt2")
            >>> tokens = model.to_tokens("the cat")[0, 1:]
            >>> model.to_string(tokens), model.to_string(int(tokens[0])), model.to_string(tokens[0])
            ('the cat', 'the', 'the')
        """
        tok = self._require_tokenizer()
        if isinstance(tokens, np.ndarray):
            tokens = torch.from_numpy(tokens)
        if not isinstance(tokens, (Tensor, list, tuple)):  # one id: an int, a numpy int (bools are refused)
            return tok.decode(tokens)
        if isinstance(tokens, Tensor) and tokens.ndim == 2:
            return [tok.decode(row.tolist()) for row in tokens]
        return tok.decode(tokens.tolist() if isinstance(tokens, Tensor) else list(tokens))

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id, e.g. `262` -> `" the"` (transformer-lens' name)."""
        if isinstance(int_token, bool) or not isinstance(int_token, int):
            raise TypeError(f"to_single_str_token: int_token must be an int, got {type(int_token).__name__}")
        return self._require_tokenizer().decode_each([int_token])[0]

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token, e.g. `" the"` -> 262."""
        ids = self._require_tokenizer().encode(string)
        if len(ids) != 1:
            raise ValueError(f"to_single_token: {string!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]

    def get_token_position(
        self,
        single_token: str | int | Tensor,
        input: str | Tensor,
        mode: Literal["first", "last"] = "first",
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
    ) -> int:
        """The position of `single_token` (a token id, or a string that is one token) in `input` (a
        string, tokenized with `prepend_bos` / `padding_side`, or ids `[pos]` / `[1, pos]`): its
        first occurrence, or its last with `mode="last"` (transformer-lens' method).

        Example:
            >>> model.get_token_position(" Mary", "When Mary and the man went out, the man gave it to Mary")
            2
            >>> model.get_token_position(" Mary", "When Mary and the man went out, the man gave it to Mary", mode="last")
            14
        """
        if mode not in ("first", "last"):
            raise ValueError(f"get_token_position: mode must be 'first' or 'last', not {mode!r}")
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
        elif isinstance(input, Tensor):
            tokens = check_integer_tensor(input, "input", "get_token_position")
        else:
            raise TypeError(
                f"get_token_position: input must be a string or a tensor of token ids, got {type(input).__name__}"
            )
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise ValueError(
                    f"get_token_position: token ids of rank two must have shape [1, seq_len], not {tuple(tokens.shape)}"
                )
            tokens = tokens[0]
        if tokens.ndim != 1:
            raise ValueError(
                f"get_token_position: input must be [pos] or [1, pos] ids, got shape {tuple(tokens.shape)}"
            )
        if isinstance(single_token, str):
            try:
                token = self.to_single_token(single_token)
            except ValueError as e:
                raise ValueError(f"get_token_position: single_token must be one token; {e}") from None
        elif isinstance(single_token, Tensor) and single_token.numel() == 1:
            token = int(single_token.item())
        elif _is_int(single_token):
            token = int(single_token)  # type: ignore[arg-type]
        else:
            raise TypeError(
                "get_token_position: single_token must be a token id or a string that is one token, "
                f"got {single_token!r:.60}"
            )
        found = (tokens == token).nonzero().flatten()
        if found.numel() == 0:
            shown = self.to_str_tokens(tokens) if self.tokenizer is not None else tokens.tolist()
            what = f"{single_token!r} (id {token})" if isinstance(single_token, str) else f"id {token}"
            raise ValueError(
                f"get_token_position: the token {what} does not occur in the prompt, whose tokens are {shown}"
            )
        return int(found[0 if mode == "first" else -1])


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
