"""The model's configuration and the named GPT-2 presets."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "ACT_FNS",
    "NORMALIZATION_TYPES",
    "POSITIONAL_EMBEDDING_TYPES",
    "Config",
    "DTYPE_NAMES",
    "as_float_dtype",
    "PRESETS",
    "preset",
]

ACT_FNS = ("gelu_new", "gelu", "relu", "gelu_fast")
NORMALIZATION_TYPES = ("LN", "LNPre", None)
POSITIONAL_EMBEDDING_TYPES = ("standard", "shortformer")


@dataclass
class Config:
    """Everything that fixes the shapes and behaviour of a `GPT`.

    Field names follow transformer-lens' `HookedTransformerConfig` so that code
    reading `model.cfg.n_layers` ports unchanged.

    Example:
        >>> cfg = Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32)
        >>> cfg.d_head, cfg.d_mlp
        (16, 256)
    """

    n_layers: int = 12
    d_model: int = 768
    n_heads: int = 12
    d_head: int = -1  # -1: d_model // n_heads, as GPT-2 does
    d_mlp: int = -1  # -1: 4 * d_model, GPT-2's width
    d_vocab: int = 50257
    n_ctx: int = 1024  # longest sequence the position embedding covers
    act_fn: str = "gelu_new"  # GPT-2 uses the tanh approximation of GELU
    layer_norm_eps: float = 1e-5
    # "LN": LayerNorm with weight and bias. "LNPre": centre-and-scale only, used once
    # fold_ln has moved the weight and bias into the layer that reads the output.
    # None: no normalisation at all (ARENA's toy models; see the toy-model fields below).
    normalization_type: Literal["LN", "LNPre"] | None = "LN"
    init_range: float = 0.02  # std of the normal init, GPT-2's value
    model_name: str = "custom"
    # The tokenizer `GPT(cfg)` loads (transformer-lens' field and default): a hub id such as
    # "EleutherAI/gpt-neox-20b" (from the local Hugging Face cache first), a folder, "gpt2" or a shipped
    # model's name; None: no tokenizer (token ids only). `from_pretrained` attaches the checkpoint's own.
    tokenizer_name: str | None = None
    default_prepend_bos: bool = True  # as transformer-lens does for GPT-2
    # Opt-in hook points (off by default because they cost memory or time):
    use_attn_result: bool = False  # attn.hook_result [batch, pos, head, d_model]
    use_split_qkv_input: bool = False  # hook_q_input/k_input/v_input [batch, pos, head, d_model]
    use_attn_in: bool = False  # hook_attn_in [batch, pos, head, d_model]
    use_hook_mlp_in: bool = False  # hook_mlp_in [batch, pos, d_model]
    use_hook_tokens: bool = False  # hook_tokens [batch, pos]
    # Toy models (ARENA 1.2's attention-only induction model), transformer-lens' names:
    attn_only: bool = False  # blocks without MLP, ln2 or resid_mid: resid_post = resid_pre + attn_out
    # "shortformer": the position embedding is added to every layer's query and key inputs
    # (after ln1), never to the residual stream; hook_pos_embed still shows it.
    positional_embedding_type: Literal["standard", "shortformer"] = "standard"
    # Where the weights are and their dtype (transformer-lens' cfg.device / cfg.dtype, which its helpers
    # read to place tensors). A new GPT is put there (device None: where it is built); GPT keeps both
    # in step when it moves (.to, .cuda, .half ...). Saved as strings ("cpu", "float32"); left out of
    # the repr, which describes the network.
    device: str | None = dataclasses.field(default=None, repr=False)
    dtype: torch.dtype = dataclasses.field(default=torch.float32, repr=False)
    # transformer-lens' words that ARENA's configs spell out: GPT-2 attends causally only, and `seed`
    # seeds a new GPT's initial weights (transformer-lens seeds every global RNG with it instead).
    attention_dir: Literal["causal"] = dataclasses.field(default="causal", repr=False)
    seed: int | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.d_head == -1:
            if self.n_heads <= 0 or self.d_model % self.n_heads:
                raise ValueError(
                    f"Config: d_model={self.d_model} is not divisible by n_heads={self.n_heads}; pass d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if self.d_mlp == -1:
            self.d_mlp = 4 * self.d_model
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Config: {name} must be a positive int, got {value!r}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise ValueError(f"Config: layer_norm_eps must be a finite number >= 0, got {eps!r}")
        if self.act_fn not in ACT_FNS:
            raise ValueError(f"Config: act_fn={self.act_fn!r} is not one of {ACT_FNS}")
        if self.normalization_type not in NORMALIZATION_TYPES:
            raise ValueError(
                f"Config: normalization_type={self.normalization_type!r}, expected one of {NORMALIZATION_TYPES}"
            )
        self._check_toy_fields()
        if self.attention_dir != "causal":
            raise ValueError(f"Config: attention_dir={self.attention_dir!r}; GPT-2 attends causally only: 'causal'")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"Config: seed must be an int or None, got {self.seed!r}")
        self.dtype = as_float_dtype(self.dtype, "Config: dtype")
        if isinstance(self.device, torch.device):
            self.device = str(self.device)
        if self.device is not None and not isinstance(self.device, str):
            raise TypeError(f"Config: device must be a string like 'cpu' or 'cuda:0', or None; got {self.device!r}")

    def _check_toy_fields(self) -> None:
        if not isinstance(self.attn_only, bool):
            raise ValueError(f"Config: attn_only must be True or False, got {self.attn_only!r}")
        if self.positional_embedding_type not in POSITIONAL_EMBEDDING_TYPES:
            raise ValueError(
                f"Config: positional_embedding_type={self.positional_embedding_type!r}, "
                f"expected one of {POSITIONAL_EMBEDDING_TYPES} ('rotary' and 'alibi' are not supported)"
            )
        if self.attn_only and self.use_hook_mlp_in:
            raise ValueError("Config: use_hook_mlp_in=True with attn_only=True: an attention-only model has no MLP")

    # -- transformer-lens' derived names (not fields: `to_dict` is unchanged) ------

    @property
    def eps(self) -> float:
        """transformer-lens' name for `layer_norm_eps` (reads and writes it)."""
        return self.layer_norm_eps

    @eps.setter
    def eps(self, value: float) -> None:
        self.layer_norm_eps = value

    @property
    def d_vocab_out(self) -> int:
        """The output vocabulary (transformer-lens' name): GPT-2 unembeds to its input vocabulary."""
        return self.d_vocab  # GPT-2 unembeds to its input vocabulary

    @property
    def original_architecture(self) -> str:
        """The Hugging Face architecture these configs describe (transformer-lens' field)."""
        return "GPT2LMHeadModel"

    @property
    def default_padding_side(self) -> str:
        """Where `to_tokens` pads a batch of prompts: "right", as transformer-lens' default."""
        return "right"

    @property
    def tokenizer_prepends_bos(self) -> bool:
        """False: GPT-2's tokenizer adds no BOS itself (`to_tokens` prepends one)."""
        return False  # GPT-2's tokenizer adds no BOS; `to_tokens` does (default_prepend_bos)

    @property
    def n_params(self) -> int:
        """transformer-lens' count of "hidden weight" parameters: W_Q, W_K, W_V, W_O, W_in, W_out
        (no embeddings, biases or LayerNorm weights)."""
        mlp = 0 if self.attn_only else 2 * self.d_model * self.d_mlp
        return self.n_layers * (4 * self.d_model * self.d_head * self.n_heads + mlp)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (dtype as its name, e.g. "float32"); `from_dict` reads them back."""
        d = dataclasses.asdict(self)
        d["dtype"] = str(self.dtype).removeprefix("torch.")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        """A config from `to_dict`'s output; an unknown key is a ValueError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"Config.from_dict: unknown fields {unknown}; known: {sorted(known)}")
        return cls(**d)


# transformer-lens' dtype names (its DTYPE_FROM_STRING), as `from_pretrained(dtype=...)` and Config take them.
DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "fp64": torch.float64,
}


def as_float_dtype(dtype: Any, arg: str = "dtype") -> torch.dtype:
    """`dtype` (a torch dtype or one of DTYPE_NAMES) as a floating-point torch.dtype."""
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        dtype = DTYPE_NAMES[dtype]
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"{arg}={dtype!r}: expected a floating-point torch.dtype (torch.float32, torch.float64 ...) "
            f"or one of {sorted(DTYPE_NAMES)}"
        )
    return dtype


# The five GPT-2 checkpoints OpenAI / Hugging Face publish. d_head is 64 in all of them.
PRESETS: dict[str, Config] = {
    "gpt2": Config(n_layers=12, d_model=768, n_heads=12, model_name="gpt2", tokenizer_name="gpt2"),
    "gpt2-medium": Config(n_layers=24, d_model=1024, n_heads=16, model_name="gpt2-medium", tokenizer_name="gpt2"),
    "gpt2-large": Config(n_layers=36, d_model=1280, n_heads=20, model_name="gpt2-large", tokenizer_name="gpt2"),
    "gpt2-xl": Config(n_layers=48, d_model=1600, n_heads=25, model_name="gpt2-xl", tokenizer_name="gpt2"),
    "distilgpt2": Config(n_layers=6, d_model=768, n_heads=12, model_name="distilgpt2", tokenizer_name="gpt2"),
}


def preset(name: str) -> Config:
    """A fresh copy of a named preset's config, e.g. ``preset("gpt2-medium")``."""
    if name not in PRESETS:
        raise KeyError(f"preset: unknown name {name!r}; known presets: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name])
