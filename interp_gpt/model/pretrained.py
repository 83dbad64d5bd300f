"""Loading a checkpoint into a model: read (sources.py), convert (convert.py), process
(processing.py), build. Offered on `GPT` as the classmethods of `PretrainedMixin`.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from ..checkpoints.convert import load_source, raise_if_bad
from ..checkpoints.processing import layer_norm_weights, process_weights
from ..checkpoints.processing import refactor_factored_attn_matrices as _refactor
from ..checkpoints.sources import CheckpointError, hub_id, shipped_models
from ..config import DTYPE_NAMES, Config, as_float_dtype

if TYPE_CHECKING:
    from .gpt import GPT, Attention

__all__ = ["PretrainedMixin"]


class PretrainedMixin:
    """`from_pretrained` and `from_pretrained_no_processing`, transformer-lens' names; `init_weights`."""

    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2's initialisation: weights ~ N(0, init_range), biases 0, LayerNorm weight 1.

        A seed gives the weights it has always given: the draws follow the order the parameters had
        before they took transformer-lens' (each attention's W_O after its W_V, not after W_Q).

        Example:
            >>> a, b = GPT(Config(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=4)), GPT(Config(n_layers=1, d_model=8, n_heads=2, d_vocab=10, n_ctx=4))
            >>> a.init_weights(seed=0); b.init_weights(seed=0); torch.equal(a.W_Q, b.W_Q)
            True
        """
        model = cast("GPT", self)
        params = dict(model.named_parameters())
        order: list[str] = []
        for name in params:
            if not name.endswith("attn.W_O"):
                order.append(name)
            if name.endswith("attn.W_V"):
                order.append(name.removesuffix("W_V") + "W_O")
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name in order:
                p = params[name]
                if name.split(".")[-1].startswith("W_"):
                    p.copy_(torch.randn(p.shape, generator=gen) * model.cfg.init_range)
                elif name.endswith(".w"):
                    p.fill_(1.0)
                else:
                    p.zero_()

    @classmethod
    def from_pretrained(
        cls: Any,  # GPT, or a subclass
        source: Any,
        *,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
        dtype: torch.dtype | str = torch.float32,
        device: str | torch.device | None = None,
        config: Config | None = None,
        tokenizer: Any = "auto",
        allow_non_finite: bool = False,
        refactor_factored_attn_matrices: bool = False,
    ) -> GPT:
        """Load a GPT-2 checkpoint, processed like transformer-lens' `from_pretrained` by default.

        `source`: a hub id ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", or any
        GPT-2 repo), a shipped model ("tiny-gpt2"), a local folder or weights file, a
        `transformers` GPT2LMHeadModel, or a transformer-lens model or state dict.
        `center_unembed` shifts every logit of a row by the same amount: compare processed
        models by log-probs. `tokenizer="auto"` attaches the checkpoint's own tokenizer files
        if it has them, else GPT-2's BPE (for a 50,257-token vocabulary); pass a `Tokenizer`
        or None to choose. A weight holding NaN or inf is refused (a `CheckpointError` naming
        it) unless `allow_non_finite=True`, which loads it with a warning.
        `refactor_factored_attn_matrices` (off by default, as in transformer-lens) re-splits W_Q/W_K
        and W_V/W_O by SVD after the other steps (see processing.refactor_factored_attn_matrices).

        Weights in .safetensors files are memory-mapped copy-on-write, as Hugging Face reads
        them: loading reads only W_U and W_Q/W_K/W_V (copies: see convert_hf_gpt2_state_dict),
        every other page is read when first used, and editing a weight changes this model only,
        never the file. Replacing the file while the model lives
        is safe (save_hf_checkpoint writes a new file and renames it); rewriting it in place
        would change the weights the model has not used yet.

        Example:
            >>> model = GPT.from_pretrained("tiny-gpt2")               # shipped; "gpt2": the hub (or its cache)
            >>> raw = GPT.from_pretrained_no_processing("tiny-gpt2")   # weights as stored (or a local folder)
        """
        dtype = as_float_dtype(dtype)  # transformer-lens' names too
        if isinstance(source, str) and not Path(source).expanduser().exists() and source not in shipped_models():
            source = hub_id(source)  # transformer-lens' aliases: "gpt2-small" is "gpt2"
        cfg, sd, folder = load_source(source, config)
        _check_finite(sd, cfg.model_name, allow_non_finite)
        if any(t.is_floating_point() and torch.finfo(t.dtype).bits < torch.finfo(dtype).bits for t in sd.values()):
            # Asked for more precision than the file holds: widen first, so the processed weights
            # are exact in `dtype`, not rounded to the file's dtype and widened after.
            sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        folded = layer_norm_weights(sd) if fold_ln and cfg.normalization_type == "LN" else {}
        # load_source's tensors are ours alone: process them where they lie (no second copy).
        sd = process_weights(sd, cfg, fold_ln, center_writing_weights, center_unembed, fold_value_biases, inplace=True)
        if refactor_factored_attn_matrices:
            _refactor(sd, cfg)
        name, cfg.tokenizer_name = cfg.tokenizer_name, None  # built without one: the checkpoint's own comes below
        try:
            with torch.device("meta"):
                model: GPT = cls(cfg)
        finally:
            cfg.tokenizer_name = name
        expected = dict(model.named_parameters())
        raise_if_bad(cfg.model_name, sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected)), [])
        model.load_state_dict(sd, strict=False, assign=True)
        # Buffers were created on the meta device: rebuild them for real.
        for block in model.blocks:
            attn = cast("Attention", block.attn)
            attn.IGNORE = torch.tensor(float("-inf"))
            attn.mask = torch.empty((0, 0), dtype=torch.bool)
        model = model.to(dtype=dtype, device=device)
        if cfg.normalization_type == "LNPre" and folded:  # what fold_ln took away (see layer_norm_weights)
            model.folded_layer_norms = folded
        from_hub = isinstance(source, str) and not Path(source).expanduser().exists() and source not in shipped_models()
        model.tokenizer = (
            _auto_tokenizer(cfg, folder, from_hub) if isinstance(tokenizer, str) and tokenizer == "auto" else tokenizer
        )
        return model.eval()

    @classmethod
    def from_pretrained_no_processing(cls: Any, source: Any, **kwargs: Any) -> GPT:
        """Load a GPT-2 checkpoint with its weights exactly as stored (no fold_ln, no centring)."""
        flags = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
        return cls.from_pretrained(source, **{**flags, **kwargs})


def _check_finite(sd: dict[str, Tensor], name: str, allow: bool) -> None:
    """Every weight finite, or a CheckpointError naming the first that is not (a warning with `allow`)."""
    for key, t in sd.items():
        flat = t.detach().reshape(-1)
        for i in range(0, flat.numel(), _FINITE_CHUNK):  # a chunk at a time: no weight-sized bool copy
            if not bool(torch.isfinite(flat[i : i + _FINITE_CHUNK]).all()):
                bad = flat[i : i + _FINITE_CHUNK]
                n = int((~torch.isfinite(bad)).sum())
                msg = f"checkpoint {name!r}: tensor {key!r} holds non-finite values (NaN or inf; {n}+ of {flat.numel():,})"
                if not allow:
                    raise CheckpointError(msg + "; pass allow_non_finite=True to load it anyway")
                warnings.warn(msg, stacklevel=4)
                break


_FINITE_CHUNK = 1 << 22

_DTYPE_NAMES = DTYPE_NAMES  # (its old name here)


def _auto_tokenizer(cfg: Config, folder: Path | None, from_hub: bool) -> Any:
    from ..tokenizer.bpe import gpt2_tokenizer, saved_tokenizer

    if folder is not None and (saved := saved_tokenizer(folder)) is not None:
        return saved
    has_files = folder is not None and (
        (folder / "tokenizer.json").exists() or (folder / "vocab.json").exists() or (folder / "encoder.json").exists()
    )
    if not has_files and cfg.d_vocab != 50257:
        return None
    try:
        # A local checkpoint does not make us call the hub for a vocabulary.
        return gpt2_tokenizer(folder if has_files else None, allow_hub=from_hub)
    except OSError as e:
        warnings.warn(f"no tokenizer attached ({e}); the model still takes token ids", stacklevel=3)
        return None
