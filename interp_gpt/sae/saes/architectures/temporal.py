"""The temporal SAE (sae-lens' TemporalSAE, arXiv 2511.01836): a predicted code from attention over
the earlier positions, and a sparse novel code of what it leaves. Inference only (sae-lens trains none).

For `x` `[batch, pos, d_in]` (normalised), `lam = 1 / (4 d_in)`, `E = W_dec^T` when `tied_weights` else
`W_enc`, and `r = x - b_dec * apply_b_dec_to_input`, each attention layer in turn does

    z   = ReLU(lam r @ E)                               codes of the residual            [b, p, d_sae]
    c   = z shifted one position later, 0 at position 0 (the context: position t sees < t)
    z'  = ReLU(attn(q = z, k = v = c))                  causal, n_heads heads, q/k width d_sae / bottleneck_factor
    s   = <z' W_dec, r> / (||z' W_dec|| + 1e-6)^2       the projection of r on the prediction  [b, p, 1]
    z_pred += s z'        r -= s z' W_dec

then the novel code is `f = ReLU(lam r @ E)` (kept to its `kval_topk` largest per position when
`sae_diff_type="topk"` and `kval_topk` is set). As in sae-lens:

    encode(x)   = f, the novel code (through hook_sae_acts_pre on `lam r @ E`, hook_sae_acts_post)
    decode(f)   = f @ W_dec + b_dec, through hook_sae_recons: the novel part only (sae-lens warns so)
    forward(x)  = (f + z_pred) @ W_dec + b_dec, through hook_sae_output, not hook_sae_recons

where `+ b_dec` only when `apply_b_dec_to_input` or not `tied_weights`. A splice
(`model.add_sae(sae)`) outputs forward's reconstruction (with the error term: `x - ` its clean pass).
The input must be a sequence `[batch, pos, d_in]` (`[batch, pos, n_heads, d_head]` with the hook_z
reshape); a row of tokens `[n, d_in]` is refused, as sae-lens cannot read it either. Each position
depends on that one and the earlier ones only: a splice into a forward that feeds only the new
token (generation with a key/value cache) sees no context.

Example:
    >>> sae = SAE(SAEConfig(d_in=64, d_sae=256, architecture="temporal", n_heads=4, bottleneck_factor=8,
    ...                     kval_topk=16, metadata={"hook_name": "blocks.1.hook_resid_post"}))
    >>> sae(torch.randn(2, 10, 64)).shape                 # predicted + novel reconstruction
    torch.Size([2, 10, 64])
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from .base import Architecture

__all__ = ["Temporal", "TemporalAttention"]

_EPS = 1e-6  # sae-lens' eps in the projection's denominator
_LINEARS = ("k_ctx", "q_target", "v_ctx", "c_proj")  # sae-lens' names, in each attn_layers.{i}


class TemporalAttention(nn.Module):
    """One attention layer over the feature codes (sae-lens' ManualAttention): queries from the
    target codes, keys and values from the context codes, causal, then an output projection.

    Example:
        >>> attn = TemporalAttention(d_sae=64, n_heads=4, bottleneck_factor=8)
        >>> attn(torch.rand(2, 5, 64), torch.rand(2, 5, 64)).shape
        torch.Size([2, 5, 64])
    """

    def __init__(
        self,
        d_sae: int,
        n_heads: int,
        bottleneck_factor: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_qk = d_sae // bottleneck_factor  # sae-lens' n_embds: the width of queries and keys, all heads
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.k_ctx = nn.Linear(d_sae, self.d_qk, **kw)
        self.q_target = nn.Linear(d_sae, self.d_qk, **kw)
        self.v_ctx = nn.Linear(d_sae, d_sae, **kw)
        self.c_proj = nn.Linear(d_sae, d_sae, **kw)

    def forward(
        self, ctx: Float[Tensor, "batch pos d_sae"], target: Float[Tensor, "batch pos d_sae"]
    ) -> Float[Tensor, "batch pos d_sae"]:
        b, p, d_sae = ctx.shape
        h = self.n_heads
        k = self.k_ctx(ctx).view(b, p, h, -1).transpose(1, 2)  # (b, h, p, d_qk / h)
        q = self.q_target(target).view(b, p, h, -1).transpose(1, 2)
        v = self.v_ctx(ctx).view(b, p, h, -1).transpose(1, 2)  # (b, h, p, d_sae / h)
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scaled by 1/sqrt(d_qk / h)
        return self.c_proj(z.transpose(1, 2).reshape(b, p, d_sae))  # type: ignore[no-any-return]

    @torch.no_grad()
    def init_weights(self, gen: torch.Generator | None) -> None:
        """sae-lens' initialisation: each Linear as torch's (uniform within 1/sqrt(fan_in)), then every
        weight row rescaled to norm 1/sqrt(the width of one head's output) (c_proj: 1/sqrt(d_sae))."""
        d_sae = self.v_ctx.in_features
        row_norm = {
            "k_ctx": 1 / math.sqrt(self.d_qk // self.n_heads),
            "q_target": 1 / math.sqrt(self.d_qk // self.n_heads),
            "v_ctx": 1 / math.sqrt(d_sae // self.n_heads),
            "c_proj": 1 / math.sqrt(d_sae),
        }
        for name in _LINEARS:
            lin: nn.Linear = getattr(self, name)
            bound = 1 / math.sqrt(lin.in_features)
            for p in (lin.weight, lin.bias):
                u = torch.rand(p.shape, generator=gen, dtype=torch.float32, device=p.device)
                p.copy_((u * 2 - 1) * bound)
            w = lin.weight
            w.copy_(row_norm[name] * w / (_EPS + w.norm(dim=1, keepdim=True)))


class Temporal(Architecture):
    """Attention over the context predicts a code; the rest is a sparse novel code (sae-lens' "temporal")."""

    name: ClassVar[str] = "temporal"
    # sae-lens' TemporalSAEConfig defaults
    fields: ClassVar[dict[str, Any]] = {
        "n_heads": 8,
        "n_attn_layers": 1,
        "bottleneck_factor": 64,
        "sae_diff_type": "topk",
        "kval_topk": None,  # None: no top-k, whatever sae_diff_type says
        "tied_weights": True,
        "activation_normalization_factor": 1.0,  # the input's factor with normalize_activations="constant_scalar_rescale"
    }
    trainable: ClassVar[bool] = False  # sae-lens has no TemporalTrainingSAE

    # ----- the tensors and the config ---------------------------------------------------------
    def shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]:
        d_in, d_sae = cfg.d_in, cfg.d_sae
        d_qk = d_sae // cfg.bottleneck_factor
        out: dict[str, tuple[int, ...]] = {"W_dec": (d_sae, d_in), "b_dec": (d_in,)}
        if not cfg.tied_weights:
            out["W_enc"] = (d_in, d_sae)
        for i in range(cfg.n_attn_layers):
            for name, width in zip(_LINEARS, (d_qk, d_qk, d_sae, d_sae), strict=True):
                out[f"attn_layers.{i}.{name}.weight"] = (width, d_sae)
                out[f"attn_layers.{i}.{name}.bias"] = (width,)
        return out

    def check_config(self, cfg: Any) -> None:
        for name, least in (("n_heads", 1), ("bottleneck_factor", 1), ("n_attn_layers", 0)):
            v = getattr(cfg, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ValueError(f"{name}={v!r}: expected an integer >= {least}")
        if cfg.d_sae % (cfg.bottleneck_factor * cfg.n_heads):
            raise ValueError(
                f"d_sae={cfg.d_sae} must be a multiple of bottleneck_factor * n_heads = "
                f"{cfg.bottleneck_factor} * {cfg.n_heads} (the attention's heads split d_sae / bottleneck_factor)"
            )
        if cfg.sae_diff_type not in ("relu", "topk"):
            raise ValueError(f"sae_diff_type={cfg.sae_diff_type!r}: expected 'relu' or 'topk'")
        k = cfg.kval_topk
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ValueError(f"kval_topk={k!r}: expected a positive integer or None")
        if cfg.sae_diff_type == "topk" and k is not None and k > cfg.d_sae:
            raise ValueError(f"kval_topk={k}: expected at most d_sae={cfg.d_sae}")
        if not isinstance(cfg.tied_weights, bool):
            raise TypeError(f"tied_weights={cfg.tied_weights!r}: expected true or false")
        f = cfg.activation_normalization_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f == 0:
            raise ValueError(f"activation_normalization_factor={f!r}: expected a finite non-zero number")
        cfg.activation_normalization_factor = float(f)
        if cfg.normalize_activations == "covariance_whitening":  # sae-lens' TemporalSAEConfig refuses it too
            raise ValueError("normalize_activations='covariance_whitening' is not supported by temporal SAEs")

    def build(self, sae: Any) -> None:
        cfg = sae.cfg
        device = torch.device(cfg.device)
        # built on the meta device (torch's own init would draw from the global generator), then placed
        # and zero-filled like the SAE's other tensors, until init_weights or a load fills them
        layers = nn.ModuleList(
            TemporalAttention(cfg.d_sae, cfg.n_heads, cfg.bottleneck_factor, device="meta", dtype=cfg.torch_dtype)
            for _ in range(cfg.n_attn_layers)
        )
        if device.type != "meta":
            layers = layers.to_empty(device=device)
            with torch.no_grad():
                for p in layers.parameters():
                    p.zero_()
        sae.attn_layers = layers

    def init_extra(self, sae: Any, gen: torch.Generator | None) -> None:
        """sae-lens' TemporalSAE initialisation: W_dec (and an untied W_enc) standard normal, b_dec 0,
        the attention layers as `TemporalAttention.init_weights`."""
        for name in ("W_dec", "W_enc"):
            if hasattr(sae, name):
                p = getattr(sae, name)
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32, device=p.device))
        for layer in sae.attn_layers:
            layer.init_weights(gen)

    # ----- inference ----------------------------------------------------------------------
    def encode(self, sae: Any, x: Tensor, hp: dict[str, Any]) -> Tensor:
        return self.encode_with_state(sae, x, hp, {})

    def encode_with_state(
        self, sae: Any, x: Float[Tensor, "batch pos d_in"], hp: dict[str, Any], state: dict[str, Any]
    ) -> Float[Tensor, "batch pos d_sae"]:
        """The novel code; the predicted one goes into `state["z_pred"]` for `forward_decode`."""
        cfg = sae.cfg
        if x.ndim != 3:
            shape = "[batch, pos, n_heads, d_head]" if cfg.reshape_activations == "hook_z" else "[batch, pos, d_in]"
            raise ValueError(
                f"x: a temporal SAE reads sequences {shape} (it attends over the positions); got a tensor of "
                f"shape {tuple(x.shape)}{' after the hook_z flatten' if cfg.reshape_activations == 'hook_z' else ''}"
            )
        lam = 1 / (4 * cfg.d_in)
        W_enc = sae.W_dec.T if cfg.tied_weights else sae.W_enc
        residual = x - sae.b_dec * cfg.apply_b_dec_to_input
        z_pred = x.new_zeros((*x.shape[:-1], cfg.d_sae))
        for layer in sae.attn_layers:
            z = torch.relu((residual * lam) @ W_enc)  # [b, p, d_sae]
            ctx = F.pad(z[:, :-1], (0, 0, 1, 0))  # one position later: position t sees the codes of < t
            z_next = torch.relu(layer(ctx, z))
            predicted = z_next @ sae.W_dec  # [b, p, d_in]
            scale = (predicted * residual).sum(-1, keepdim=True) / (predicted.norm(dim=-1, keepdim=True) + _EPS).pow(2)
            z_pred = z_pred + z_next * scale
            residual = residual - scale * predicted
        novel = torch.relu(hp["hook_sae_acts_pre"]((residual * lam) @ W_enc))
        if cfg.sae_diff_type == "topk" and cfg.kval_topk is not None:
            values, indices = novel.topk(cfg.kval_topk, dim=-1, sorted=False)
            novel = torch.zeros_like(novel).scatter_(-1, indices, values)
        state["z_pred"] = z_pred
        return novel

    def decode(self, sae: Any, feature_acts: Tensor) -> Tensor:
        out = feature_acts @ sae.W_dec
        if sae.cfg.apply_b_dec_to_input or not sae.cfg.tied_weights:  # sae-lens' rule
            out = out + sae.b_dec
        return out

    def forward_decode(self, sae: Any, feature_acts: Tensor, state: dict[str, Any], hp: dict[str, Any]) -> Tensor:
        """The predicted and the novel code decoded together; past hook_sae_recons, as in sae-lens."""
        return self.decode(sae, feature_acts + state["z_pred"])
