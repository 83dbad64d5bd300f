"""One random GPT-2 with GPT-2's real vocabulary, as ours and as transformer-lens', for the tests
of the TL helpers that read text (test_prompt, evals, head_detector).

The reference is transformer-lens 3.9's HookedTransformer where that is installed, else 4.x's
TransformerBridge in compatibility mode (CI runs both venvs), both built offline: the Hugging
Face tokenizer comes from the `vocab` extra's encoder.json / vocab.bpe.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

N_CTX = 64


def hf_tokenizer(vocab_dir: Path, add_bos_token: bool) -> Any:
    """GPT-2's tokenizer as Hugging Face builds it; `add_bos_token=True` is what transformer-lens
    gives its GPT-2 models (their `encode` then starts with BOS)."""
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (vocab_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    tok = transformers.GPT2TokenizerFast(
        vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line], add_bos_token=add_bos_token
    )
    tok.pad_token = tok.eos_token
    tok.init_kwargs["name_or_path"] = "gpt2-offline"  # transformer-lens reads it (and would go to the hub without it)
    return tok


def hf_gpt2() -> Any:
    """A random 2-layer GPT-2 (d_model 64) with the full 50,257-token vocabulary, biases and LayerNorms perturbed."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=N_CTX, vocab_size=50257)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
        model.transformer.wte.weight.mul_(20.0)  # logits far from uniform, so ranks and top-k are not float noise
    return model.eval()


def ours(hf: Any, vocab_dir: Path) -> Any:
    from interp_gpt import from_pretrained_no_processing
    from interp_gpt.tokenizer import gpt2_tokenizer

    model = from_pretrained_no_processing(hf)
    model.tokenizer = gpt2_tokenizer(vocab_dir)
    return model.eval()


def tl_config(hf: Any, **extra: Any) -> Any:
    """transformer-lens 3.x's HookedTransformerConfig for the Hugging Face GPT-2 `hf` (plus `extra` fields)."""
    tl = pytest.importorskip("transformer_lens")
    c = hf.config
    return tl.HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_ctx=c.n_positions,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        original_architecture="GPT2LMHeadModel",
        **extra,
    )


def reference(hf: Any, vocab_dir: Path) -> Any:
    """transformer-lens' model of `hf` (3.9 HookedTransformer, or 4.x TransformerBridge), unprocessed."""
    pytest.importorskip("transformer_lens")
    from interp_gpt.compare import transformer_lens_major

    tok = hf_tokenizer(vocab_dir, add_bos_token=True)
    if transformer_lens_major() >= 4:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(
            "gpt2-offline", hf_model=copy.deepcopy(hf), tokenizer=tok, device="cpu"
        )
        bridge.eval().enable_compatibility_mode(disable_warnings=True, no_processing=True)
        return bridge
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    cfg = tl_config(hf, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HookedTransformer is deprecated in 3.9
        model = HookedTransformer(cfg, tokenizer=tok)
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg),
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    return model.eval()


def tl_major() -> int:
    from interp_gpt.compare import transformer_lens_major

    return transformer_lens_major()
