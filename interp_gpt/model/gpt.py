"""GPT-2, written to be read top to bottom in one sitting.

The components follow ARENA's transformer-from-scratch exercise and carry
transformer-lens' parameter and hook names, so a transformer-lens GPT-2 state
dict loads here with `strict=True` and code written against transformer-lens'
hook names runs unchanged:

    tokens -> Embed + PosEmbed -> [TransformerBlock] x n_layers -> LayerNorm -> Unembed -> logits
    TransformerBlock: resid_pre -> ln1 -> Attention -> (+) resid_mid -> ln2 -> MLP -> (+) resid_post

Every activation passes through a `HookPoint` (see hooks.py); the comment beside
each hook point gives its shape.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Union

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..checks import check_layer, check_resid
from ..config import Config
from ..factored import FactoredMatrix
from ..hooks import HookPoint, explicit_paths
from ..tokenizer.by_name import tokenizer_by_name
from ..utils import lm_cross_entropy_loss
from .activations import ACTIVATIONS, IN_PLACE, add_bias, by_heads, unembed_in_slices
from .attention_blocks import blocks_apply, causal_attention_in_blocks
from .generation import GenerationMixin, KVCache, rollback_on_error
from .hooked import HookedGPT
from .pretrained import PretrainedMixin
from .splicing import SplicingMixin
from .stacked import StackedWeightsMixin
from .weights import ProcessingMixin

if TYPE_CHECKING:
    from ..tokenizer.bpe import Tokenizer

__all__ = ["Embed", "PosEmbed", "LayerNorm", "NoNorm", "make_norm", "Attention", "MLP", "TransformerBlock", "Unembed", "GPT"]  # fmt: skip

# Residual-stream inputs carry a head axis when the opt-in per-head input hooks are on.
Resid = Union[Float[Tensor, "batch posn d_model"], Float[Tensor, "batch posn n_heads d_model"]]


class Embed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: Int[Tensor, "batch posn"]) -> Float[Tensor, "batch posn d_model"]:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(
        self,
        tokens: Int[Tensor, "batch posn"],
        past_len: int = 0,
        attention_mask: Int[Tensor, "batch past_and_posn"] | None = None,
    ) -> Float[Tensor, "batch posn d_model"]:
        batch, posn = tokens.shape
        if attention_mask is None:
            # A copy, not a view: a hook editing it in place must not touch W_pos.
            return self.W_pos[past_len : past_len + posn].expand(batch, posn, -1).clone()
        # With padding, a prompt's first real token is position 0 wherever it sits;
        # padding positions get a zero embedding (as transformer-lens does).
        positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)[:, past_len:]
        is_pad = ~attention_mask[:, past_len:].bool()
        return torch.where(is_pad[..., None], 0.0, self.W_pos[positions])


class LayerNorm(nn.Module):
    """Centre, scale to unit RMS, then apply a learned weight and bias.

    With `cfg.normalization_type == "LNPre"` (after fold_ln has moved `w` and `b`
    into the next layer's weights) there are no parameters: centre and scale only.
    `hook_normalized` sees the normalised vector before `w` and `b`, as in transformer-lens.
    """

    def __init__(self, cfg: Config, length: int | None = None):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.has_params = cfg.normalization_type == "LN"
        if self.has_params:
            self.w = nn.Parameter(torch.ones(length or cfg.d_model))
            self.b = nn.Parameter(torch.zeros(length or cfg.d_model))
        self.hook_scale = HookPoint()  # [batch, posn, 1] (or [batch, posn, n_heads, 1])
        self.hook_normalized = HookPoint()  # [batch, posn, d_model] (or with n_heads)

    def forward(self, x: Resid) -> Resid:
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks or explicit_paths()):
            # Fast path, same maths in one fused kernel, when nobody looks at the pieces (nor caches: hooks.py).
            w, b = (self.w, self.b) if self.has_params else (None, None)
            return F.layer_norm(x, x.shape[-1:], w, b, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale)
        return x * self.w + self.b if self.has_params else x


class NoNorm(nn.Identity):
    """`normalization_type=None` (toy models): ln1, ln2 and ln_final pass the stream through
    unchanged, with no parameters and no hook points, as in transformer-lens."""

    has_params = False


def make_norm(cfg: Config) -> LayerNorm | NoNorm:
    return NoNorm() if cfg.normalization_type is None else LayerNorm(cfg)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        # In transformer-lens' order (its named_parameters: W_Q, W_O, b_Q, b_O, then W_K, W_V, b_K, b_V).
        self.W_Q = nn.Parameter(torch.empty(h, d, dh))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        self.b_Q = nn.Parameter(torch.zeros(h, dh))
        self.b_O = nn.Parameter(torch.zeros(d))
        self.W_K = nn.Parameter(torch.empty(h, d, dh))
        self.W_V = nn.Parameter(torch.empty(h, d, dh))
        self.b_K = nn.Parameter(torch.zeros(h, dh))
        self.b_V = nn.Parameter(torch.zeros(h, dh))
        # Masked scores are set to -inf, so they get exactly zero probability.
        self.register_buffer("IGNORE", torch.tensor(float("-inf")))
        # An empty "mask" buffer as transformer-lens 3.x keeps, so state dicts move both ways with
        # strict=True; the causal mask itself is built per forward for the current length.
        self.register_buffer("mask", torch.empty((0, 0), dtype=torch.bool))
        self.hook_q = HookPoint()  # [batch, posn, n_heads, d_head]
        self.hook_k = HookPoint()  # [batch, posn, n_heads, d_head]
        self.hook_v = HookPoint()  # [batch, posn, n_heads, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, n_heads, query_pos, key_pos], scaled and masked
        self.hook_pattern = HookPoint()  # [batch, n_heads, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, posn, n_heads, d_head]
        self.hook_result = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_attn_result

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        # Accept any "mask" buffer (older transformer-lens stored a full n_ctx x n_ctx one).
        if prefix + "mask" in state_dict:
            state_dict[prefix + "mask"] = self.mask
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def OV(self) -> FactoredMatrix:  # [n_heads, d_model, d_model]: what each head writes for what it reads
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self) -> FactoredMatrix:  # [n_heads, d_model (query), d_model (key)]: what each head attends by
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    def project(self, x: Resid, W: Tensor, b: Tensor) -> Float[Tensor, "batch posn n_heads d_head"]:
        if x.ndim == 3 and not (x.requires_grad and torch.is_grad_enabled()):  # one input for all heads
            # a broadcast view, heads as a batch axis: W read where it lies, no [d_model, n_heads*d_head] copy
            x = einops.repeat(x, "batch posn d_model -> batch posn n_heads d_model", n_heads=W.shape[0])
        elif x.ndim == 3:  # under autograd one matmul, heads side by side: its gradient is one matmul (by_heads)
            return add_bias(by_heads(x, W), b)
        x_axes = "batch posn d_model" if x.ndim == 3 else "batch posn n_heads d_model"
        return add_bias(einops.einsum(x, W, f"{x_axes}, n_heads d_model d_head -> batch posn n_heads d_head"), b)

    def forward(
        self,
        query_input: Resid,
        key_input: Resid,
        value_input: Resid,
        attention_mask: Int[Tensor, "batch key_pos"] | None = None,
        kv_cache: tuple[KVCache, int] | None = None,
    ) -> Float[Tensor, "batch posn d_model"]:
        q = self.hook_q(self.project(query_input, self.W_Q, self.b_Q))
        k = self.hook_k(self.project(key_input, self.W_K, self.b_K))
        v = self.hook_v(self.project(value_input, self.W_V, self.b_V))
        past = 0
        if kv_cache is not None:  # generation: attend to the cached positions too
            cache, layer = kv_cache
            past = k.shape[1]
            k, v = cache.extend(layer, k, v)
            past = k.shape[1] - past

        q_pos = torch.arange(past, past + q.shape[1], device=q.device)
        k_pos = torch.arange(k.shape[1], device=q.device)
        allowed = k_pos[None, :] <= q_pos[:, None]  # [q_pos, k_pos]: causal
        if attention_mask is not None:  # and never attend to padding
            allowed = allowed & attention_mask[:, None, None, :].bool()  # [batch, 1, q_pos, k_pos]

        explicit = self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks or explicit_paths()
        if explicit and attention_mask is None and past == 0 and blocks_apply(q, k, v):
            # A long causal context: the same maths a block of queries at a time, skipping the masked part.
            z = causal_attention_in_blocks(q, k, v, self.hook_attn_scores, self.hook_pattern)
        elif explicit:
            # q / sqrt(d_head) before the product (the same maths as scaling the scores, exactly
            # so for d_head = 64) and the mask written in place: on a long context each pass
            # over a fresh [batch, n_heads, q_pos, k_pos] tensor costs as much as a matmul.
            scores = einops.einsum(
                q / math.sqrt(self.cfg.d_head),
                k,
                "batch q_pos n_heads d_head, batch k_pos n_heads d_head -> batch n_heads q_pos k_pos",
            )
            scores = self.hook_attn_scores(scores.masked_fill_(~allowed, self.IGNORE))
            pattern = scores.softmax(dim=-1)
            if attention_mask is not None:
                # A padding query that may attend to nothing (only with padding) has a NaN row: make it 0.
                pattern = torch.where(pattern.isnan(), 0.0, pattern)
            pattern = self.hook_pattern(pattern)
            z = einops.einsum(
                v, pattern, "batch k_pos n_heads d_head, batch n_heads q_pos k_pos -> batch q_pos n_heads d_head"
            )
        else:
            # Nobody hooks the scores or the pattern, nor caches (hooks.py): let PyTorch's fused kernel compute the
            # same softmax(q k^T / sqrt(d_head)) v without materialising [q_pos, k_pos].
            z = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),  # [batch, n_heads, posn, d_head]
                attn_mask=None if attention_mask is None and past == 0 else allowed,
                is_causal=attention_mask is None and past == 0,
            ).transpose(1, 2)
            if attention_mask is not None:
                z = torch.where(z.isnan(), 0.0, z)
        z = self.hook_z(z)
        if self.cfg.use_attn_result:
            result = self.hook_result(
                einops.einsum(
                    z, self.W_O, "batch posn n_heads d_head, n_heads d_head d_model -> batch posn n_heads d_model"
                )
            )
            return result.sum(dim=2) + self.b_O
        if z.requires_grad and torch.is_grad_enabled():  # one matmul, heads side by side (as by_heads)
            return add_bias(z.flatten(-2) @ self.W_O.flatten(0, 1), self.b_O)
        out = einops.einsum(z, self.W_O, "batch posn n_heads d_head, n_heads d_head d_model -> batch posn d_model")
        return add_bias(out, self.b_O)


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, posn, d_mlp]
        self.hook_post = HookPoint()  # [batch, posn, d_mlp]

    def forward(self, x: Float[Tensor, "batch posn d_model"]) -> Float[Tensor, "batch posn d_model"]:
        pre = self.hook_pre(
            add_bias(einops.einsum(x, self.W_in, "batch posn d_model, d_model d_mlp -> batch posn d_mlp"), self.b_in)
        )
        act_in_place = IN_PLACE.get(self.act_fn)
        if act_in_place is not None and not torch.is_grad_enabled() and not self.hook_pre.has_hooks:
            post = act_in_place(pre)  # nobody keeps pre: overwrite it rather than allocate d_mlp more
        else:
            post = self.act_fn(pre)
        post = self.hook_post(post)
        return add_bias(
            einops.einsum(post, self.W_out, "batch posn d_mlp, d_mlp d_model -> batch posn d_model"), self.b_out
        )


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Config, layer: int):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.ln1 = make_norm(cfg)
        if not cfg.attn_only:  # transformer-lens' order again: ln1, ln2, attn, mlp
            self.ln2 = make_norm(cfg)
        self.attn = Attention(cfg)
        if not cfg.attn_only:  # an attention-only block has no ln2, MLP, resid_mid or mlp hooks
            self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, posn, d_model]
        self.hook_attn_in = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_attn_in
        self.hook_q_input = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_split_qkv_input
        self.hook_k_input = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_split_qkv_input
        self.hook_v_input = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_split_qkv_input
        self.hook_attn_out = HookPoint()  # [batch, posn, d_model]
        if not cfg.attn_only:
            self.hook_resid_mid = HookPoint()  # [batch, posn, d_model]
            self.hook_mlp_in = HookPoint()  # [batch, posn, d_model], opt-in: cfg.use_hook_mlp_in
            self.hook_mlp_out = HookPoint()  # [batch, posn, d_model]
        self.hook_resid_post = HookPoint()  # [batch, posn, d_model]

    def forward(
        self,
        resid_pre: Float[Tensor, "batch posn d_model"],
        attention_mask: Int[Tensor, "batch key_pos"] | None = None,
        kv_cache: KVCache | None = None,
        *,
        shortformer_pos_embed: Float[Tensor, "batch posn d_model"] | None = None,
    ) -> Float[Tensor, "batch posn d_model"]:
        cfg = self.cfg
        resid_pre = self.hook_resid_pre(resid_pre)
        if cfg.use_attn_in or cfg.use_split_qkv_input:
            # Give every head its own copy of the residual stream, so it can be patched per head.
            attn_in = einops.repeat(resid_pre, "batch posn d_model -> batch posn n_heads d_model", n_heads=cfg.n_heads)
            if cfg.use_attn_in:
                attn_in = self.hook_attn_in(attn_in.clone())
            if cfg.use_split_qkv_input:
                q_in, k_in, v_in = self.hook_q_input(attn_in), self.hook_k_input(attn_in), self.hook_v_input(attn_in)
                q_in, k_in, v_in = self.ln1(q_in), self.ln1(k_in), self.ln1(v_in)
            else:
                q_in = k_in = v_in = self.ln1(attn_in)
        else:
            q_in = k_in = v_in = self.ln1(resid_pre)
        if shortformer_pos_embed is not None:  # positions reach the queries and keys only, after ln1
            pos = shortformer_pos_embed if q_in.ndim == 3 else shortformer_pos_embed[:, :, None]
            q_in, k_in = q_in + pos, k_in + pos
        attn_out = self.hook_attn_out(
            self.attn(q_in, k_in, v_in, attention_mask, None if kv_cache is None else (kv_cache, self.layer))
        )
        if cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_in = self.hook_mlp_in(resid_mid.clone()) if cfg.use_hook_mlp_in else resid_mid
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mlp_in)))
        return self.hook_resid_post(resid_mid + mlp_out)


class Unembed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))
        self.hook_in = HookPoint()  # [batch, posn, d_model]
        self.hook_out = HookPoint()  # [batch, posn, d_vocab]

    VOCAB_SLICE = 2048  # vocabulary slice width of the CPU fast path (see unembed_in_slices)

    def forward(self, x: Float[Tensor, "batch posn d_model"]) -> Float[Tensor, "batch posn d_vocab"]:
        x = self.hook_in(x)
        if x.device.type == "cpu" and not torch.is_grad_enabled() and x.shape[:-1].numel() >= 64:
            return self.hook_out(unembed_in_slices(x, self.W_U, self.b_U, self.VOCAB_SLICE))  # the same, faster
        logits = einops.einsum(x, self.W_U, "batch posn d_model, d_model d_vocab -> batch posn d_vocab") + self.b_U
        return self.hook_out(logits)


ReturnType = Literal["logits", "loss", "both", None]


class GPT(GenerationMixin, StackedWeightsMixin, PretrainedMixin, ProcessingMixin, SplicingMixin, HookedGPT):
    """A GPT-2 with a hook point on every activation.

    This file holds the network; GPT's other methods (transformer-lens' names) come from the mixins'
    modules beside this one (model/): generation (and text), stacked, pretrained, weights, splicing, hooked.

    Example:
        >>> model = GPT.from_pretrained("tiny-gpt2")         # shipped; or "gpt2", a local folder / file
        >>> logits = model("The Eiffel Tower is in")         # [batch, posn, d_vocab]
        >>> logits, cache = model.run_with_cache("Hello world")
        >>> cache["pattern", 0].shape                         # [batch, head, q_pos, k_pos]
    """

    def __init__(self, cfg: Config, tokenizer: Tokenizer | None = None):
        super().__init__()
        self.cfg = cfg
        # No tokenizer given: the one cfg.tokenizer_name names, as transformer-lens loads it (tokenizer/by_name.py).
        self.tokenizer = (
            tokenizer_by_name(cfg.tokenizer_name) if tokenizer is None and cfg.tokenizer_name else tokenizer
        )
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, posn, d_model]
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()  # [batch, posn, d_model]
        self.hook_tokens = HookPoint()  # [batch, posn], opt-in: cfg.use_hook_tokens
        self.blocks = nn.ModuleList([TransformerBlock(cfg, i) for i in range(cfg.n_layers)])
        self.ln_final = make_norm(cfg)
        self.unembed = Unembed(cfg)
        if not self.unembed.W_U.is_meta:  # a loader builds on "meta" and assigns the weights
            self.init_weights(cfg.seed)  # cfg.seed None: torch's global generator
        self.setup_hooks()

    # ----- forward ---------------------------------------------------------
    def forward(
        self,
        input: str | list[str] | Int[Tensor, "batch posn"] | Float[Tensor, "batch posn d_model"],
        return_type: ReturnType = "logits",
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        tokens: Int[Tensor, "batch posn"] | None = None,
        attention_mask: Int[Tensor, "batch posn"] | None = None,
        past_kv_cache: KVCache | None = None,
    ) -> Any:
        """Run the model.

        `input` is a string, a list of strings (padded; each prompt gets the logits it
        would get alone), or token ids `[batch, posn]`. With `start_at_layer`, `input`
        is instead the residual stream entering that layer (pass `tokens` too for a loss).
        `stop_at_layer=L` returns the residual stream entering layer L instead of logits.
        `return_type`: "logits", "loss" (mean next-token cross-entropy; per token with
        `loss_per_token`), "both" (logits, loss) or None.
        `attention_mask` [batch, posn]: 1 for real tokens, 0 for padding.
        `past_kv_cache`: a `KVCache` holding earlier positions (see `generate`); `input` is
        then only the new tokens, and the cache is extended with them.
        """
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type={return_type!r}, expected 'logits', 'loss', 'both' or None")
        n = self.cfg.n_layers
        start = 0 if start_at_layer is None else check_layer(start_at_layer, n, "start_at_layer", allow_end=True)
        stop = None if stop_at_layer is None else check_layer(stop_at_layer, n, "stop_at_layer", allow_end=True)
        past = 0 if past_kv_cache is None else past_kv_cache.length
        if past_kv_cache is not None and (start_at_layer is not None or stop is not None):
            raise ValueError("past_kv_cache cannot be combined with start_at_layer / stop_at_layer")
        shortformer = self.cfg.positional_embedding_type == "shortformer"
        with rollback_on_error(past_kv_cache):  # a forward cut short (an error, Ctrl-C) leaves the cache as it was
            if start_at_layer is None:
                tokens, attention_mask = self._tokens_and_mask(input, prepend_bos, padding_side, attention_mask, past)
                if past_kv_cache is not None:  # the mask then covers the cached positions too
                    attention_mask = past_kv_cache.extend_mask(attention_mask, tokens)
                if self.cfg.use_hook_tokens:
                    tokens = self.hook_tokens(tokens)
                embed = self.hook_embed(self.embed(tokens))
                pos_embed = self.hook_pos_embed(self.pos_embed(tokens, past, attention_mask))
                resid = embed if shortformer else embed + pos_embed  # shortformer: pos_embed goes to q, k
            else:
                dtype = None if torch.is_autocast_enabled() else self.W_E.dtype  # autocast mixes dtypes on purpose
                resid = check_resid(input, self.cfg.d_model, "input (with start_at_layer)", dtype)
                tokens = None if tokens is None else self._check_tokens(tokens, arg="tokens")
                attention_mask = None if attention_mask is None else self._check_mask(attention_mask, resid[..., 0])
                pos_embed = self.pos_embed(resid[..., 0], 0, attention_mask) if shortformer else None

            short = pos_embed if shortformer else None  # shortformer: each layer's queries and keys add it
            for block in self.blocks[start:stop]:
                resid = block(resid, attention_mask, past_kv_cache, shortformer_pos_embed=short)
            if stop is not None:
                return resid

            logits = self.unembed(self.ln_final(resid))
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if tokens is None:
            raise ValueError("return_type='loss' with start_at_layer needs tokens= (the targets)")
        if past_kv_cache is not None:
            raise ValueError("return_type='loss' is not available with past_kv_cache (the targets span the cache)")
        loss = lm_cross_entropy_loss(logits, tokens, attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)
