"""Small helpers shared across the package, named as in transformer-lens."""

from __future__ import annotations

import importlib
import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .checks import check_int, check_int_in_range
from .factored import FactoredMatrix
from .slices import Slice  # noqa: F401 (transformer-lens offers it as utils.Slice)

if TYPE_CHECKING:
    from .config import Config

__all__ = [
    "hook_shape",
    "get_act_name",
    "to_numpy",
    "get_device",
    "get_corner",
    "lm_cross_entropy_loss",
    "composition_scores",
    "lm_accuracy",
    "test_prompt",
    "FactoredMatrix",
    "Slice",
    "check_int",
    "check_int_in_range",
]

# Short names people type, mapped to the hook names they mean.
_ACT_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_post": "post",
}
_LAYER_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
# Per-head inputs (q_input, k_input, v_input, attn_in) and mlp_in are hooks of the block, not of attn/mlp.
_ATTN_ACTS = {"q", "k", "v", "z", "result", "pattern", "attn_scores"}
_MLP_ACTS = {"pre", "post"}
_LN_ACTS = {"scale", "normalized"}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """The full hook name for a short activation name, as transformer-lens spells it.

    Examples:
        >>> get_act_name("k", 6)
        'blocks.6.attn.hook_k'
        >>> get_act_name("scale", 2, "ln1")
        'blocks.2.ln1.hook_scale'
        >>> get_act_name("resid_post", 0)
        'blocks.0.hook_resid_post'
        >>> get_act_name("pre5")
        'blocks.5.mlp.hook_pre'
        >>> get_act_name("scale")
        'ln_final.hook_scale'
        >>> get_act_name("pattern", torch.tensor(3))
        'blocks.3.attn.hook_pattern'
    """
    if not isinstance(name, str):
        raise TypeError(f"get_act_name: name must be a str, got {type(name).__name__}")
    if layer is not None:  # an int, a numpy int or a 0-d integer tensor (a loop over torch.arange gives those)
        layer = check_int(layer, "layer", caller="get_act_name")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name  # already a full name
    if layer is not None and layer_type is None and name.startswith(f"blocks.{layer}."):
        return name  # a full name in that layer (e.g. an SAE's feature hook), as the sweeps pass it
    packed = re.fullmatch(r"([a-z_]+?)(\d+)([a-z0-9_]*)", name)
    if packed and layer is None:  # "pre5", "scale4ln1", "k6a"
        name, layer, layer_type = packed.group(1), int(packed.group(2)), packed.group(3) or None
    name = _ACT_ALIASES.get(name, name)
    if name in _ATTN_ACTS:
        layer_type = "attn"
    elif name in _MLP_ACTS:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIASES:
        layer_type = _LAYER_TYPE_ALIASES[layer_type]
    parts = []
    if layer is not None:
        parts.append(f"blocks.{layer}")
    if layer_type:
        parts.append(layer_type)
    parts.append(f"hook_{name}")
    full = ".".join(parts)
    if name in _LN_ACTS and layer is None:
        full = f"ln_final.{full}"
    return full


def hook_shape(cfg: Config, name: str) -> tuple[int, ...] | None:
    """The shape of hook `name`'s activation at one position (what follows `[batch, pos]`), from the config
    alone; None for the hooks that hold no vector per position (attention scores and pattern, token ids).
    The one rule steering, SAE fitting, SAE training and the activation store read widths by.

    Example:
        >>> cfg = preset("gpt2")
        >>> hook_shape(cfg, "blocks.3.attn.hook_z"), hook_shape(cfg, "blocks.3.mlp.hook_post")
        ((12, 64), (3072,))
    """
    last = name.rsplit(".", 1)[-1]
    if last in ("hook_attn_scores", "hook_pattern", "hook_tokens"):
        return None
    if last in ("hook_q", "hook_k", "hook_v", "hook_z"):
        return (cfg.n_heads, cfg.d_head)
    if re.fullmatch(r"blocks\.\d+\.(attn\.hook_result|hook_attn_in|hook_[qkv]_input)", name):
        return (cfg.n_heads, cfg.d_model)  # opt-in: one copy of the input per head, or each head's output
    if name.endswith(("mlp.hook_pre", "mlp.hook_post")):
        return (cfg.d_mlp,)
    if name == "unembed.hook_out":
        return (cfg.d_vocab,)
    width = 1 if last == "hook_scale" else cfg.d_model
    per_head_ln1 = re.fullmatch(r"blocks\.\d+\.ln1\.hook_\w+", name) and (cfg.use_split_qkv_input or cfg.use_attn_in)
    return (cfg.n_heads, width) if per_head_ln1 else (width,)


def to_numpy(tensor: Any) -> np.ndarray:
    """A numpy array of a tensor (detached, moved to the CPU; bfloat16, which numpy lacks, as float32),
    a list or tuple, a number, a bool or a string; a numpy array comes back as it is. As
    transformer-lens' `utils.to_numpy`, but anything else is a `TypeError` naming it.

    Example:
        >>> to_numpy(torch.tensor([1.0, 2.0]))
        array([1., 2.], dtype=float32)
        >>> to_numpy([[1, 2], [3, 4]]).shape
        (2, 2)
    """
    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, (list, tuple)):
        return np.array(tensor)
    if isinstance(tensor, Tensor):
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if isinstance(tensor, (int, float, bool, str)):
        return np.array(tensor)
    raise TypeError(
        f"to_numpy: tensor must be a torch tensor, a numpy array, a list or tuple, or a number, bool or str; "
        f"got {type(tensor).__name__}"
    )


def get_device() -> str:
    """The best device this machine has, as transformer-lens 3.9's `utils.get_device` names it: "cuda" when
    a CUDA GPU is available, else "mps" on Apple silicon when `TRANSFORMERLENS_ALLOW_MPS=1` is set
    (transformer-lens' opt-in: MPS has known correctness issues), else "cpu". So `model.to(utils.get_device())`
    ports.

    Example:
        >>> get_device() in ("cuda", "mps", "cpu")
        True
    """
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available() and os.environ.get("TRANSFORMERLENS_ALLOW_MPS", "") == "1":
        return "mps"
    return "cpu"


def get_corner(tensor: Any, n: int = 3) -> Any:
    """The top-left `n x n x ...` corner of a tensor or a FactoredMatrix (its first `n` entries along
    every axis), as transformer-lens' `utils.get_corner`: a small piece to print.

    Example:
        >>> get_corner(torch.arange(16).reshape(4, 4), 2)
        tensor([[0, 1],
                [4, 5]])
    """
    n = check_int_in_range(n, "n", 0, None, caller="get_corner")
    if not isinstance(tensor, (Tensor, FactoredMatrix)):
        raise TypeError(f"get_corner: tensor must be a torch tensor or a FactoredMatrix, got {type(tensor).__name__}")
    return tensor[tuple(slice(n) for _ in range(tensor.ndim))]


def lm_cross_entropy_loss(
    logits: Float[Tensor, "batch posn d_vocab"],
    tokens: Int[Tensor, "batch posn"],
    attention_mask: Int[Tensor, "batch posn"] | None = None,
    per_token: bool = False,
) -> Tensor:
    """Next-token cross-entropy; padding (mask 0) neither predicts nor is predicted."""
    if tokens.shape != logits.shape[:2]:
        raise ValueError(f"tokens: shape {tuple(tokens.shape)} does not match logits {tuple(logits.shape[:2])}")
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch, posn - 1]
    if attention_mask is None:
        return loss if per_token else loss.mean()
    valid = (attention_mask[:, 1:] * attention_mask[:, :-1]).to(loss.dtype)
    loss = loss * valid
    return loss if per_token else loss.sum() / valid.sum()


def composition_scores(
    left: FactoredMatrix, right: FactoredMatrix, broadcast_dims: bool = True
) -> Float[Tensor, "*leading"]:
    """How strongly `left` feeds `right`: `||left @ right|| / (||left|| ||right||)` (Frobenius norms),
    one score per leading index, as transformer-lens' `composition_scores`.

    With `broadcast_dims` (the default) every matrix of `left` meets every matrix of `right`: the
    result is `[*left's leading axes, *right's leading axes]` (model.OV against model.QK gives
    `[n_layers, n_heads, n_layers, n_heads]`). Without it the leading axes broadcast against each other.
    `left`'s columns (`rdim`) must match `right`'s rows (`ldim`), normally d_model.
    """
    for name, matrix in (("left", left), ("right", right)):
        if not isinstance(matrix, FactoredMatrix):
            raise TypeError(
                f"composition_scores: {name} must be a FactoredMatrix (such as model.OV or model.QK), "
                f"got {type(matrix).__name__}"
            )
    if not isinstance(broadcast_dims, bool):
        raise TypeError(f"composition_scores: broadcast_dims must be a bool, got {broadcast_dims!r}")
    if left.rdim != right.ldim:
        raise ValueError(
            f"composition_scores: left has shape {tuple(left.shape)} and right has shape {tuple(right.shape)}: "
            f"left's columns ({left.rdim}) must match right's rows ({right.ldim}), the residual stream width"
        )
    # left = U_l (S_l V_l^T) and right = (U_r S_r) V_r^T, with U_l and V_r orthonormal, so
    # ||left @ right|| = ||(S_l V_l^T) @ (U_r S_r)||: a [k, k] product per pair instead of [ldim, rdim].
    inner_left, inner_right = left.collapse_l(), right.collapse_r()
    norm_left, norm_right = left.norm(), right.norm()
    if broadcast_dims:
        n_left, n_right = left.ndim - 2, right.ndim - 2
        inner_left = inner_left.reshape((*inner_left.shape[:-2], *(1,) * n_right, *inner_left.shape[-2:]))
        norm_left = norm_left.reshape((*norm_left.shape, *(1,) * n_right))
        inner_right = inner_right.reshape((1,) * n_left + inner_right.shape)
        norm_right = norm_right.reshape((1,) * n_left + norm_right.shape)
    try:
        product = inner_left @ inner_right
    except RuntimeError:
        raise ValueError(
            f"composition_scores: with broadcast_dims=False the leading axes of left (shape {tuple(left.shape)}) "
            f"and right (shape {tuple(right.shape)}) must broadcast against each other"
        ) from None
    return torch.linalg.matrix_norm(product) / norm_left / norm_right


def lm_accuracy(
    logits: Float[Tensor, "batch posn d_vocab"], tokens: Int[Tensor, "batch posn"], per_token: bool = False
) -> Tensor:
    """Top-1 accuracy of next-token prediction, as transformer-lens' `lm_accuracy`.

    With `per_token`, a bool tensor `[batch, posn - 1]` (position p is right when the argmax of
    logits[:, p] is tokens[:, p + 1]); otherwise the fraction right, a 0-d float tensor.

    Example:
        >>> model = GPT.from_pretrained("tiny-gpt2")
        >>> tokens = model.to_tokens("The cat sat on the mat")
        >>> lm_accuracy(model(tokens), tokens)
        tensor(0.1250)
    """
    for arg, t in (("logits", logits), ("tokens", tokens)):
        if not isinstance(t, Tensor):
            raise TypeError(f"lm_accuracy: {arg} must be a tensor, got {type(t).__name__}")
    if logits.ndim != 3 or tokens.ndim != 2 or tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"lm_accuracy: logits must be [batch, posn, d_vocab] and tokens [batch, posn] with the same batch and "
            f"posn, got logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)}"
        )
    correct = logits.argmax(dim=-1)[:, :-1] == tokens[:, 1:]
    return correct if per_token else correct.sum() / correct.numel()


def test_prompt(
    prompt: str,
    answer: str | list[str],
    model: Any,
    prepend_space_to_answer: bool = True,
    print_details: bool = True,
    prepend_bos: bool | None = None,
    top_k: int = 10,
) -> None:
    """Print how well the model predicts `answer` after `prompt`: rank, logit and probability of each
    answer token, and the top `top_k` predictions, as transformer-lens' `utils.test_prompt` prints them.

    `answer` may be several tokens long (each is scored after the ones before it), or a list of
    strings: then only the first token of each is scored, all at the position after the prompt.
    `prepend_space_to_answer` adds a leading space to an answer that has none; `prepend_bos`
    defaults to `cfg.default_prepend_bos`. Prints and returns nothing.

    The text is transformer-lens'. Like transformer-lens, the answer lines go through `rich` (bold,
    and a line wider than the terminal wrapped) where `rich` is installed; without it they are
    printed plainly, unwrapped.

    Example (the shipped tiny-gpt2, whose small vocabulary splits " mat" in two):
        >>> test_prompt("The cat sat on the", "mat", GPT.from_pretrained("tiny-gpt2"), top_k=2)
        Tokenized prompt: ['<|endoftext|>', 'The', ' c', 'at', ' sat', ' on', ' the']
        Tokenized answer: [' m', 'at']
        Performance on answer token:
        Rank: 22       Logit:  6.26 Prob:  0.77% Token: | m|
        Top 0th token. Logit:  8.30 Prob:  5.88% Token: |
        |
        Top 1th token. Logit:  7.73 Prob:  3.31% Token: | c|
        Performance on answer token:
        Rank: 39       Logit:  7.02 Prob:  0.50% Token: |at|
        Top 0th token. Logit: 10.09 Prob: 10.77% Token: |o|
        Top 1th token. Logit:  9.48 Prob:  5.85% Token: |aj|
        Ranks of the answer tokens: [(' m', 22), ('at', 39)]
    """
    answers, top_k = _check_test_prompt(prompt, answer, model, prepend_space_to_answer, top_k)
    n_answers = len(answers)
    multiple = n_answers > 1
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)
    if multiple:  # one token per answer, all predicted at the position after the prompt
        answer_tokens = torch.cat([model.to_tokens(a, prepend_bos=False)[:, :1] for a in answers])
    else:
        answer_tokens = model.to_tokens(answers, prepend_bos=False)
    tokens = torch.cat((prompt_tokens.repeat(answer_tokens.shape[0], 1), answer_tokens.to(prompt_tokens.device)), dim=1)
    prompt_str_tokens = model.to_str_tokens(prompt, prepend_bos=prepend_bos)
    answer_str_tokens_list = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    prompt_length = len(prompt_str_tokens)
    answer_length = 1 if multiple else len(answer_str_tokens_list[0])

    if print_details:
        print("Tokenized prompt:", prompt_str_tokens)
        if multiple:
            print("Tokenized answers:", answer_str_tokens_list)
        else:
            print("Tokenized answer:", answer_str_tokens_list[0])
    with torch.no_grad():
        logits = model(tokens)
    probs = logits.softmax(dim=-1)
    answer_ranks = []
    for index in range(prompt_length, prompt_length + answer_length):
        answer_ids = tokens[:, index]
        answer_str_tokens = [a[index - prompt_length] for a in answer_str_tokens_list]
        token_probs = probs[:, index - 1]  # the prediction for position `index` is made one before it
        # The same two sorts as transformer-lens, so ties rank the same way.
        sorted_token_probs, sorted_token_positions = token_probs.sort(descending=True)
        ranks = sorted_token_positions.argsort(-1)[range(n_answers), answer_ids.cpu()].tolist()
        answer_ranks.append(list(zip(answer_str_tokens, ranks, strict=True)))
        if print_details:
            ranked = (sorted_token_probs, sorted_token_positions)
            _print_position(
                model, logits[:, index - 1], token_probs, ranked, answer_ids, answer_str_tokens, ranks, top_k
            )
    # One answer: one (token, rank) per answer token, unwrapped, as transformer-lens prints it.
    ranks_text = f"{[r[0] for r in answer_ranks] if not multiple else answer_ranks}"
    _rich_print(f"[b]Ranks of the answer tokens:[/b] {ranks_text}", f"Ranks of the answer tokens: {ranks_text}")


def _check_test_prompt(
    prompt: Any, answer: Any, model: Any, prepend_space_to_answer: bool, top_k: Any
) -> tuple[Any, int]:
    """`test_prompt`'s arguments checked, by name: (the answers as a list or tuple of str, top_k)."""
    caller = "test_prompt"
    if not isinstance(prompt, str):
        raise TypeError(f"{caller}: prompt must be a str, got {type(prompt).__name__}")
    answers = [answer] if isinstance(answer, str) else answer
    if not isinstance(answers, (list, tuple)) or not answers or not all(isinstance(a, str) for a in answers):
        raise TypeError(f"{caller}: answer must be a str or a non-empty list of str, got {answer!r}")
    if any(a == "" for a in answers) and not prepend_space_to_answer:
        raise ValueError(f"{caller}: answer holds an empty string, which has no token to score: {answer!r}")
    top_k = check_int_in_range(top_k, "top_k", 0, model.cfg.d_vocab, caller=caller)
    return answers, top_k


def _print_position(
    model: Any,
    logits: Tensor,
    token_probs: Tensor,
    ranked: tuple[Tensor, Tensor],
    answer_ids: Tensor,
    answer_str_tokens: list[str],
    ranks: list[int],
    top_k: int,
) -> None:
    """Print one answer position: each answer token's rank, logit and probability (`logits`, `token_probs`:
    `[n_answers, d_vocab]`, the prediction made there; `ranked`: `token_probs` sorted, descending, and the
    order), then the first row's top `top_k` predictions."""
    n_answers = len(answer_str_tokens)
    lines = []
    for i in range(n_answers):
        logit = logits[i, answer_ids[i]].item()
        prob = token_probs[i, answer_ids[i]].item()
        lines.append(f"Rank: {ranks[i]: <8} Logit: {logit:5.2f} Prob: {prob:6.2%} Token: |{answer_str_tokens[i]}|")
    head = f"Performance on answer token{'s' if n_answers > 1 else ''}:\n"
    _rich_print(head + "\n".join(f"[b]{line}[/b]" for line in lines), head + "\n".join(lines))
    sorted_token_probs, sorted_token_positions = ranked
    for i in range(top_k):
        token = sorted_token_positions[0, i]
        logit = logits[0, token].item()
        prob = sorted_token_probs[0, i].item()
        print(f"Top {i}th token. Logit: {logit:5.2f} Prob: {prob:6.2%} Token: |{model.to_string(token)}|")


def _rich_print(markup: str, plain: str) -> None:
    """Print as transformer-lens does, through `rich` (bold, wrapped to the terminal) where it is
    installed (transformer-lens depends on it), else the same text plainly."""
    try:
        rich = importlib.import_module("rich")  # optional: not a dependency of ours (nor typed for mypy here)
    except ImportError:
        print(plain)
    else:
        rich.print(markup)


# pytest would otherwise collect `test_prompt` as a test wherever it is imported into a test module.
test_prompt.__test__ = False  # type: ignore[attr-defined]
