"""The one way in for the analysis packages (`circuits`, `attribution`): the model check and the
prompt-to-tokens step every entry point of theirs runs first, each call with its own `caller` so that
an error names the function the user called.

- `checked_model`: an interp_gpt `GPT`. A module spliced in (an SAE, a transcoder: `model.add_sae`,
  `with model.saes(...)`) is refused, or allowed with its error term, as the caller says: the circuit
  tools' exact edge patching reads the model's own values, which a module with its error term leaves
  unchanged; gradients (EAP) and the attribution tools' replacement model, built from hooks on the
  unchanged model, are wrong with any module spliced in.
- `prompts`: a batch of prompts (the circuit tools): text, right-padded by `model.to_tokens` with each
  row's number of real tokens kept, or token ids `[batch, pos]` (every position real).
- `prompt_tokens`: one prompt (the attribution tools): text or token ids `[pos]`, a BOS put first
  unless it starts with the tokenizer's BOS, EOS or pad token (circuit-tracer's rule).

Both prompt steps check every id against the vocabulary (`checks.check_token_ids`), refuse an empty
prompt and one longer than the model's context. Each package keeps its own clean run, since the two
need different ones: the circuit tools one no-grad run keeping every sender's output
(`circuits._run.base_run`), the attribution tools the replacement model's forward pass with gradients
(`attribution.replacement.run_forward`).

Example:
    >>> from interp_gpt import GPT
    >>> from interp_gpt.prepare import checked_model, prompt_tokens
    >>> model = checked_model(GPT.from_pretrained("tiny-gpt2"), "my_tool", splices="none", why="take it out")
    >>> prompt_tokens(model, "Hello", "my_tool").tolist() == model.to_tokens("Hello")[0].tolist()
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from .checks import check_token_ids, check_tokens, check_type
from .model.gpt import GPT

__all__ = ["Prompts", "checked_model", "prompt_tokens", "prompts"]


# ----------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------
def checked_model(model: Any, caller: str, *, splices: Literal["none", "error_term"], why: str) -> GPT:
    """`model`, checked: an interp_gpt GPT with no module spliced in (`splices="none"`), or only modules
    spliced with their error term (`"error_term"`). `why` ends the refusal: why such a module makes the
    caller's result wrong, and how to take it out.

    Example:
        >>> checked_model(model, "patch_edges", splices="error_term", why="splice it with use_error_term=True")
    """
    model = check_type(model, GPT, "model", "an interp_gpt GPT", caller)
    for name, module in model.acts_to_saes.items():
        point: Any = model.hook_dict[name]
        if splices == "error_term" and point.use_error_term:
            continue
        kind = type(module).__name__
        acronym = kind[:2].isupper()  # "an SAE", "a CLTLayer", "a Transcoder"
        article = "an" if kind[:1] in ("AEFHILMNORSX" if acronym else "AEIOU") else "a"
        without = " without the error term" if splices == "error_term" else ""
        raise ValueError(
            f"{caller}: {article} {kind} ({module.extra_repr()}) is spliced in at {name!r}{without}; {why}"
        )
    return model


# ----------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------
@dataclass
class Prompts:
    """Token ids `[batch, pos]` and each row's number of real tokens (None: every position is real)."""

    ids: Tensor
    lengths: list[int] | None

    def length(self, row: int) -> int:
        return self.ids.shape[1] if self.lengths is None else self.lengths[row]


def prompts(model: GPT, x: Any, arg: str, caller: str) -> Prompts:
    """A batch of prompts: token ids from strings (with each row's real length) or token ids `[batch, pos]`
    (or `[pos]`; every position real), on the model's device.

    Example:
        >>> prompts(model, ["The cat sat", "A dog"], "clean_tokens", "patch_edges").lengths  # tiny-gpt2, BOS first
        [5, 4]
    """
    if isinstance(x, (str, list)) and (isinstance(x, str) or all(isinstance(s, str) for s in x)):
        ids, mask = model.to_tokens(x, return_mask=True)
        return Prompts(ids, [int(n) for n in mask.sum(dim=1).tolist()])
    if isinstance(x, list):  # not all strings: to_tokens says what it takes
        return Prompts(model.to_tokens(x), None)
    expected = "a string, a list of strings or a tensor of token ids"
    ids = check_tokens(x, model.cfg.d_vocab, model.cfg.n_ctx, arg, caller=caller, expected=expected)
    return Prompts(ids.to(model.W_E.device), None)


def prompt_tokens(model: GPT, prompt: Any, caller: str) -> Tensor:
    """One prompt's token ids `[pos]` on the model's device, with a BOS first unless the prompt starts with
    the tokenizer's BOS, EOS or pad token (circuit-tracer's `ensure_tokenized`), checked.

    Example:
        >>> prompt_tokens(model, [15, 99], "attribute")   # tiny-gpt2: its BOS is 2047
        tensor([2047,   15,   99])
    """
    tok = getattr(model, "tokenizer", None)
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"{caller}: prompt is empty; pass some text or token ids")
        if tok is None:
            raise ValueError(f"{caller}: prompt={prompt[:40]!r} is text but the model has no tokenizer; pass token ids")
        tokens = model.to_tokens(prompt, prepend_bos=False)[0]
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = torch.tensor(prompt, dtype=torch.long)
    elif isinstance(prompt, Tensor):
        if prompt.ndim == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.ndim != 1 or prompt.is_floating_point() or prompt.dtype == torch.bool:
            raise TypeError(
                f"{caller}: prompt: a {prompt.dtype} tensor of shape {tuple(prompt.shape)}; expected token ids "
                "[pos] (or [1, pos])"
            )
        tokens = prompt.to(torch.long)
    else:
        raise TypeError(f"{caller}: prompt={prompt!r}: expected text, a list of token ids or a tensor of token ids")
    if tokens.numel() == 0:
        raise ValueError(f"{caller}: prompt has no tokens; pass some text or token ids")
    check_token_ids(tokens, model.cfg.d_vocab, "prompt", caller=caller)
    if tok is not None:
        special = {getattr(tok, n, None) for n in ("bos_token_id", "eos_token_id", "pad_token_id")} - {None}
        if int(tokens[0]) not in special:
            tokens = torch.cat([torch.tensor([tok.bos_token_id]), tokens])
    n_ctx = model.cfg.n_ctx
    if tokens.shape[0] > n_ctx:
        raise ValueError(f"{caller}: prompt is {tokens.shape[0]} tokens (BOS included); the model's context is {n_ctx}")
    return tokens.to(model.W_E.device)
