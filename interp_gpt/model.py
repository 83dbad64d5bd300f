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

from .config import Config
from .hooks import HookedModule, HookPoint

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

# Residual-stream inputs carry a head axis when the opt-in per-head input hooks are on.
Resid = Union[Float[Tensor, "batch posn d_model"], Float[Tensor, "batch posn n_heads d_model"]]


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU, the tanh approximation from the original OpenAI code:
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    PyTorch's `gelu(approximate="tanh")` computes exactly this formula in one fused
    kernel (several times faster than writing it out; equal up to float rounding).
    """
    return F.gelu(x, approximate="tanh")


def gelu_fast(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


ACTIVATIONS = {"gelu_new": gelu_new, "gelu_fast": gelu_fast, "gelu": F.gelu, "relu": F.relu}
# The same functions overwriting their input, for when nothing else holds it (see MLP.forward).
IN_PLACE = {
    gelu_new: lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    F.gelu: torch.ops.aten.gelu_,
    F.relu: torch.relu_,
}


def add_bias(x: Tensor, b: Tensor) -> Tensor:
    """x + b for a fresh matmul output x that nothing else holds.

    With no autograd graph being recorded (inference_mode, no_grad) the bias is added in
    place: no new tensor, one pass over memory fewer. With MLP's in-place activation this took
    2-7% off a GPT-2 forward on a 2-core Intel Xeon VM and changed nothing measurable on a
    2-core AMD EPYC one (`python bench/in_place.py`). Bit-identical.
    Under autocast (x in a lower precision than b) the sum is promoted, as x + b would be.
    """
    if torch.is_grad_enabled() or x.dtype != b.dtype:
        return x + b
    return x.add_(b)


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
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks):
            # Fast path, same maths in one fused kernel, when nobody looks at the pieces.
            w, b = (self.w, self.b) if self.has_params else (None, None)
            return F.layer_norm(x, x.shape[-1:], w, b, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale)
        return x * self.w + self.b if self.has_params else x


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

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's keys and values to layer `layer`'s and return the full ones."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=1)
            v = torch.cat([self.values[layer], v], dim=1)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(h, d, dh))
        self.W_K = nn.Parameter(torch.empty(h, d, dh))
        self.W_V = nn.Parameter(torch.empty(h, d, dh))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        self.b_Q = nn.Parameter(torch.zeros(h, dh))
        self.b_K = nn.Parameter(torch.zeros(h, dh))
        self.b_V = nn.Parameter(torch.zeros(h, dh))
        self.b_O = nn.Parameter(torch.zeros(d))
        # Masked scores are set to -inf, so they get exactly zero probability.
        self.register_buffer("IGNORE", torch.tensor(float("-inf")))
        # transformer-lens 3.x keeps an empty "mask" buffer in its state dict; we keep one
        # too so state dicts move both ways with strict=True. The causal mask itself is
        # built per forward for the current length.
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

    def project(self, x: Resid, W: Tensor, b: Tensor) -> Float[Tensor, "batch posn n_heads d_head"]:
        if x.ndim == 3:  # one input shared by all heads (else one per head: use_split_qkv_input)
            # A broadcast view, no memory: with heads as a batch axis the einsum reads W where it
            # lies instead of copying it into one [d_model, n_heads*d_head] matrix on every call.
            x = einops.repeat(x, "batch posn d_model -> batch posn n_heads d_model", n_heads=W.shape[0])
        return add_bias(
            einops.einsum(x, W, "batch posn n_heads d_model, n_heads d_model d_head -> batch posn n_heads d_head"), b
        )

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

        if self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks:
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
                # A padding query that may attend to nothing has a row of -inf -> NaN; make it 0.
                # (Without padding every query sees at least itself.)
                pattern = torch.where(pattern.isnan(), 0.0, pattern)
            pattern = self.hook_pattern(pattern)
            z = einops.einsum(
                v, pattern, "batch k_pos n_heads d_head, batch n_heads q_pos k_pos -> batch q_pos n_heads d_head"
            )
        else:
            # Nobody hooks the scores or the pattern: let PyTorch's fused kernel compute the
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
        return add_bias(
            einops.einsum(z, self.W_O, "batch posn n_heads d_head, n_heads d_head d_model -> batch posn d_model"),
            self.b_O,
        )


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
        self.ln1 = LayerNorm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = LayerNorm(cfg)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, posn, d_model]
        self.hook_attn_in = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_attn_in
        self.hook_q_input = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_split_qkv_input
        self.hook_k_input = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_split_qkv_input
        self.hook_v_input = HookPoint()  # [batch, posn, n_heads, d_model], opt-in: cfg.use_split_qkv_input
        self.hook_attn_out = HookPoint()  # [batch, posn, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, posn, d_model]
        self.hook_mlp_in = HookPoint()  # [batch, posn, d_model], opt-in: cfg.use_hook_mlp_in
        self.hook_mlp_out = HookPoint()  # [batch, posn, d_model]
        self.hook_resid_post = HookPoint()  # [batch, posn, d_model]

    def forward(
        self,
        resid_pre: Float[Tensor, "batch posn d_model"],
        attention_mask: Int[Tensor, "batch key_pos"] | None = None,
        kv_cache: KVCache | None = None,
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
        attn_out = self.hook_attn_out(
            self.attn(q_in, k_in, v_in, attention_mask, None if kv_cache is None else (kv_cache, self.layer))
        )
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

    # Vocabulary slice width of the CPU fast path below.
    VOCAB_SLICE = 2048

    def forward(self, x: Float[Tensor, "batch posn d_model"]) -> Float[Tensor, "batch posn d_vocab"]:
        x = self.hook_in(x)
        d_vocab = self.W_U.shape[1]
        if (
            x.device.type != "cpu"
            or torch.is_grad_enabled()
            or x.shape[:-1].numel() < 64
            or d_vocab <= 2 * self.VOCAB_SLICE
        ):
            logits = einops.einsum(x, self.W_U, "batch posn d_model, d_model d_vocab -> batch posn d_vocab") + self.b_U
        else:
            # The same einsum one slice of the vocabulary at a time. GPT-2's W_U (154 MB) is
            # far larger than the CPU's cache; a [d_model, 2048] slice fits, and every position
            # reuses it before the next is read. This matmul is a third of a GPT-2 forward, and
            # slicing it took the whole forward from ~1.0 to ~0.87 x Hugging Face's time on a
            # 2-core CPU (bench/run.py, forward, 4 x 128 tokens).
            logits = x.new_empty(*x.shape[:-1], d_vocab)
            for start in range(0, d_vocab, self.VOCAB_SLICE):
                cols = slice(start, start + self.VOCAB_SLICE)
                sliced = einops.einsum(
                    x, self.W_U[:, cols], "batch posn d_model, d_model d_vocab -> batch posn d_vocab"
                )
                torch.add(sliced, self.b_U[cols], out=logits[..., cols])  # the bias add writes the slice in place
        return self.hook_out(logits)


# Opt-in hook points exist only while their Config flag is on (as in transformer-lens);
# asking for one while it is off gives an error that names the flag.
_OPT_IN_HOOKS = {
    "attn.hook_result": "use_attn_result",
    "hook_attn_in": "use_attn_in",
    "hook_q_input": "use_split_qkv_input",
    "hook_k_input": "use_split_qkv_input",
    "hook_v_input": "use_split_qkv_input",
    "hook_mlp_in": "use_hook_mlp_in",
    "hook_tokens": "use_hook_tokens",
}


def _opt_in_flag(hook_name: str) -> str | None:
    for suffix, flag in _OPT_IN_HOOKS.items():
        if hook_name == suffix or hook_name.endswith("." + suffix):
            return flag
    return None


ReturnType = Literal["logits", "loss", "both", None]


class GPT(HookedModule):
    """A GPT-2 with a hook point on every activation.

    Example:
        >>> model = GPT.from_pretrained("gpt2")              # or a local folder / file
        >>> logits = model("The Eiffel Tower is in")         # [batch, posn, d_vocab]
        >>> logits, cache = model.run_with_cache("Hello world")
        >>> cache["pattern", 0].shape                         # [batch, head, q_pos, k_pos]
    """

    def __init__(self, cfg: Config, tokenizer: Tokenizer | None = None):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, posn, d_model]
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()  # [batch, posn, d_model]
        self.hook_tokens = HookPoint()  # [batch, posn], opt-in: cfg.use_hook_tokens
        self.blocks = nn.ModuleList([TransformerBlock(cfg, i) for i in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg)
        self.unembed = Unembed(cfg)
        if not self.unembed.W_U.is_meta:  # a loader builds on "meta" and assigns the weights
            self.init_weights()
        self.setup_hooks()

    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2's initialisation: weights ~ N(0, init_range), biases 0, LayerNorm weight 1."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.split(".")[-1].startswith("W_"):
                    p.copy_(torch.randn(p.shape, generator=gen) * self.cfg.init_range)
                elif name.endswith(".w"):
                    p.fill_(1.0)
                else:
                    p.zero_()

    # ----- hooks -----------------------------------------------------------
    def setup_hooks(self) -> None:
        super().setup_hooks()
        all_points = self._all_hook_points
        for name in list(self.hook_dict):
            flag = _opt_in_flag(name)
            if flag and not getattr(self.cfg, flag):
                del self.hook_dict[name]
        self._all_hook_points = all_points
        self._hook_names = list(self.hook_dict)

    def _unknown_hook_error(self, name: str) -> KeyError:
        flag = _opt_in_flag(name)
        if flag and not getattr(self.cfg, flag):
            return KeyError(
                f"hook point {name!r} is opt-in and off: set cfg.{flag}=True (model.set_{flag}(True)) to create it"
            )
        return super()._unknown_hook_error(name)

    def _set_flag(self, flag: str, value: bool) -> None:
        setattr(self.cfg, flag, bool(value))
        self.setup_hooks()

    def set_use_attn_result(self, value: bool) -> None:
        """Compute and expose each head's output, `blocks.L.attn.hook_result` [batch, posn, head, d_model]."""
        self._set_flag("use_attn_result", value)

    def set_use_split_qkv_input(self, value: bool) -> None:
        """Give each head its own copy of its Q/K/V input (`hook_q_input` etc.)."""
        self._set_flag("use_split_qkv_input", value)

    def set_use_attn_in(self, value: bool) -> None:
        """Expose the attention input per head as `blocks.L.hook_attn_in`."""
        self._set_flag("use_attn_in", value)

    def set_use_hook_mlp_in(self, value: bool) -> None:
        """Expose the MLP's input as `blocks.L.hook_mlp_in`."""
        self._set_flag("use_hook_mlp_in", value)

    def run_with_cache(self, *model_args: Any, names_filter: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        """Run the model and cache activations (see `HookedModule.run_with_cache`).

        With `return_type=None` nothing downstream of the cached hooks is needed, so the
        forward pass stops after the last layer the filter selects: caching layer 3 of
        12 runs 4 blocks. The output is then None.

        Example:
            >>> _, cache = model.run_with_cache(tokens, names_filter="blocks.3.attn.hook_pattern", return_type=None)
        """
        stop = None
        if (
            kwargs.get("return_type", "logits") is None
            and kwargs.get("stop_at_layer") is None
            and not kwargs.get("incl_bwd")
        ):
            names = [hp.name for hp in self.hook_points(names_filter, arg="names_filter")]
            layers = [int(n.split(".")[1]) if n.startswith("blocks.") else self.cfg.n_layers for n in names]
            if names and max(layers) < self.cfg.n_layers - 1 and kwargs.get("start_at_layer") is None:
                stop = max(layers) + 1
        if stop is None:
            return super().run_with_cache(*model_args, names_filter=names_filter, **kwargs)
        _, cache = super().run_with_cache(*model_args, names_filter=names_filter, stop_at_layer=stop, **kwargs)
        return None, cache

    # ----- input checking --------------------------------------------------
    def _check_tokens(self, tokens: Any, past_len: int = 0, arg: str = "input") -> Int[Tensor, "batch posn"]:
        if not isinstance(tokens, Tensor):
            raise TypeError(
                f"{arg}: expected a string, a list of strings or a tensor of token ids, got {type(tokens).__name__}"
            )
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TypeError(
                f"{arg}: token ids must be an integer tensor, got dtype {tokens.dtype}; "
                "to run from a residual stream, pass start_at_layer"
            )
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise ValueError(f"{arg}: tokens must have shape [batch, posn] or [posn], got shape {tuple(tokens.shape)}")
        if tokens.shape[1] == 0:
            raise ValueError(f"{arg}: got an empty sequence (shape {tuple(tokens.shape)})")
        if tokens.shape[1] + past_len > self.cfg.n_ctx:
            raise ValueError(
                f"{arg}: {tokens.shape[1] + past_len} tokens is longer than the context of {self.cfg.n_ctx} (cfg.n_ctx)"
            )
        bad = (tokens < 0) | (tokens >= self.cfg.d_vocab)
        if bad.any():
            where = tuple(bad.nonzero()[0].tolist())
            raise ValueError(
                f"{arg}: token id {tokens[where].item()} at [batch, posn] = {list(where)} is out of range "
                f"for a vocabulary of {self.cfg.d_vocab} (ids 0..{self.cfg.d_vocab - 1})"
            )
        return tokens.to(self.W_E.device)

    def _check_layer(self, value: int | None, arg: str, allow_end: bool) -> int | None:
        if value is None:
            return None
        n = self.cfg.n_layers
        hi = n if allow_end else n - 1
        if not isinstance(value, int) or isinstance(value, bool) or not -n <= value <= hi:
            raise ValueError(f"{arg}={value!r} is out of range: layers are 0..{n - 1} (negative counts from the end)")
        return value % n if value < 0 else value

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
        start = self._check_layer(start_at_layer, "start_at_layer", allow_end=True) or 0
        stop = self._check_layer(stop_at_layer, "stop_at_layer", allow_end=True)
        past = 0 if past_kv_cache is None else past_kv_cache.length
        if past_kv_cache is not None and (start_at_layer is not None or stop is not None):
            raise ValueError("past_kv_cache cannot be combined with start_at_layer / stop_at_layer")
        if start_at_layer is None:
            if isinstance(input, (str, list)):
                tokens, mask = self.to_tokens(
                    input, prepend_bos=prepend_bos, padding_side=padding_side, return_mask=True
                )
                if attention_mask is None and not bool(mask.all()):
                    attention_mask = mask
            else:
                tokens = self._check_tokens(input, past_len=past)
            if attention_mask is not None:
                attention_mask = self._check_mask(attention_mask, tokens)
            if past_kv_cache is not None:
                # The mask covers every position the cache has seen plus the new ones.
                new = attention_mask if attention_mask is not None else torch.ones_like(tokens)
                if past_kv_cache.attention_mask is not None:
                    new = torch.cat([past_kv_cache.attention_mask, new], dim=1)
                if new.shape[0] != tokens.shape[0]:
                    raise ValueError(f"past_kv_cache: holds a batch of {new.shape[0]}, input has {tokens.shape[0]}")
                past_kv_cache.attention_mask = new
                attention_mask = None if bool(new.all()) else new
            if self.cfg.use_hook_tokens:
                tokens = self.hook_tokens(tokens)
            embed = self.hook_embed(self.embed(tokens))
            pos_embed = self.hook_pos_embed(self.pos_embed(tokens, past, attention_mask))
            resid = embed + pos_embed
        else:
            if (
                not isinstance(input, Tensor)
                or not input.is_floating_point()
                or input.ndim != 3
                or input.shape[-1] != self.cfg.d_model
            ):
                got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
                raise ValueError(
                    f"input: with start_at_layer the input is a residual stream [batch, posn, d_model={self.cfg.d_model}], got {got}"
                )
            resid = input
            if tokens is not None:
                tokens = self._check_tokens(tokens, arg="tokens")
            if attention_mask is not None:
                attention_mask = self._check_mask(attention_mask, resid[..., 0])

        for block in self.blocks[start:stop]:
            resid = block(resid, attention_mask, past_kv_cache)
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
            >>> model.generate("The cat sat on the", max_new_tokens=5, do_sample=False)
            'The cat sat on the mat, and the cat'
        """
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if do_sample and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature!r}")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
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
            if stop_at_eos:
                next_tok = torch.where(finished, eos_token_id, next_tok)
                finished |= next_tok == eos_token_id
            out = torch.cat([out, next_tok[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(next_tok[:, None])], dim=1)
            step_input, step_mask = next_tok[:, None], torch.ones_like(next_tok[:, None])
            if stop_at_eos and bool(finished.all()):
                break
        if return_type == "tokens" or (return_type == "input" and isinstance(input, Tensor)):
            return out
        texts = [self.tokenizer.decode(row[m.bool()].tolist()) for row, m in zip(out, mask, strict=True)]  # type: ignore[union-attr]
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
        logits = logits / temperature
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p is not None:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest set reaching top_p
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]

    def _check_mask(self, attention_mask: Tensor, like: Tensor) -> Tensor:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != like.shape[:2]:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask: expected shape {tuple(like.shape[:2])} (batch, posn), got {got}")
        return attention_mask.to(self.W_E.device)

    # ----- tokenizer helpers (transformer-lens' names and habits) ----------
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

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token, e.g. `" the"` -> 262."""
        ids = self._require_tokenizer().encode(string)
        if len(ids) != 1:
            raise ValueError(f"to_single_token: {string!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]

    # ----- weights, stacked across layers (as transformer-lens exposes them) ----
    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed.W_U

    def _stack(self, module: str, param: str) -> Tensor:
        return torch.stack([getattr(getattr(b, module), param) for b in self.blocks])

    W_Q = property(lambda self: self._stack("attn", "W_Q"), doc="[n_layers, n_heads, d_model, d_head]")
    W_K = property(lambda self: self._stack("attn", "W_K"), doc="[n_layers, n_heads, d_model, d_head]")
    W_V = property(lambda self: self._stack("attn", "W_V"), doc="[n_layers, n_heads, d_model, d_head]")
    W_O = property(lambda self: self._stack("attn", "W_O"), doc="[n_layers, n_heads, d_head, d_model]")
    b_Q = property(lambda self: self._stack("attn", "b_Q"), doc="[n_layers, n_heads, d_head]")
    b_K = property(lambda self: self._stack("attn", "b_K"), doc="[n_layers, n_heads, d_head]")
    b_V = property(lambda self: self._stack("attn", "b_V"), doc="[n_layers, n_heads, d_head]")
    b_O = property(lambda self: self._stack("attn", "b_O"), doc="[n_layers, d_model]")
    W_in = property(lambda self: self._stack("mlp", "W_in"), doc="[n_layers, d_model, d_mlp]")
    W_out = property(lambda self: self._stack("mlp", "W_out"), doc="[n_layers, d_mlp, d_model]")
    b_in = property(lambda self: self._stack("mlp", "b_in"), doc="[n_layers, d_mlp]")
    b_out = property(lambda self: self._stack("mlp", "b_out"), doc="[n_layers, d_model]")

    # ----- loading (loading.py does the work) -------------------------------
    @classmethod
    def from_pretrained(cls, source: Any, **kwargs: Any) -> GPT:
        """Load GPT-2 weights, processed as transformer-lens' `from_pretrained` does by default.

        `source`: a hub id ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", or any
        GPT-2 repo), a local folder or weights file, a `transformers` GPT2LMHeadModel, or a
        transformer-lens model or state dict. See `interp_gpt.loading.from_pretrained`.

        Example:
            >>> model = GPT.from_pretrained("gpt2")                      # fold_ln etc. applied
            >>> raw = GPT.from_pretrained_no_processing("./my-gpt2")     # weights as stored
        """
        from .loading import from_pretrained

        return from_pretrained(source, **kwargs)

    @classmethod
    def from_pretrained_no_processing(cls, source: Any, **kwargs: Any) -> GPT:
        """Load GPT-2 weights exactly as stored (no fold_ln, no centring)."""
        from .loading import from_pretrained_no_processing

        return from_pretrained_no_processing(source, **kwargs)


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
