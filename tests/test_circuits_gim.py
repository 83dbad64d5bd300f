"""GIM's gradient modifications (`interp_gpt.circuits.rules.gim_rules`) against gim-explain's own
(`gim.GIM` on a transformer-lens 3.9 HookedTransformer holding the same random weights): the metric's
gradient at every layer's residual stream is the same, with gim-explain's defaults and with each
modification alone. Skips without `gim` (`pip install gim-explain`) or without transformer-lens 3.x
(gim-explain's transformer-lens path hooks `hook_q` / `hook_scale` by name on a HookedTransformer)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import Config
from interp_gpt.circuits.rules import gim_rules
from interp_gpt.compare import transformer_lens_major

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import random_model, resid_pre_grads  # noqa: E402

gim = pytest.importorskip("gim")
pytest.importorskip("transformer_lens")
pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(transformer_lens_major() >= 4, reason="gim-explain's transformer-lens path: HookedTransformer"),
]

CFG = Config(n_layers=3, d_model=32, n_heads=4, d_vocab=50, n_ctx=16)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].sum() - logits[:, -1, 5].sum() + 0.1 * logits[:, :, 7].sum()


def _hooked_transformer(ours: Any) -> Any:
    """transformer-lens 3.9's HookedTransformer with our weights (the same parameter names), in
    float64 (its attention casts the pattern to cfg.dtype)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    c = ours.cfg
    theirs = HookedTransformer(
        HookedTransformerConfig(
            n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head, d_mlp=c.d_mlp,
            d_vocab=c.d_vocab, n_ctx=c.n_ctx, act_fn=c.act_fn, eps=c.layer_norm_eps, normalization_type="LN", dtype=torch.float64,
        )
    )  # fmt: skip
    weights = {k: v for k, v in ours.state_dict().items() if not k.endswith((".IGNORE", ".mask"))}
    missing, unexpected = theirs.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith((".IGNORE", ".mask")) for k in missing), (missing, unexpected)
    return theirs.eval()


@pytest.fixture(scope="module")
def pair():  # type: ignore[no-untyped-def]
    ours = random_model(CFG, seed=5)  # float64: gradients compared to ~1e-7
    with torch.no_grad():  # random_model's x5 weights saturate the softmax: tone them down a little
        for name, p in ours.named_parameters():
            if name.split(".")[-1].startswith("W_"):
                p.mul_(0.4)
    theirs = _hooked_transformer(ours)
    tokens = torch.randint(0, CFG.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    return ours, theirs, tokens


def _our_grads(model: Any, tokens: torch.Tensor, rules: list[Any]) -> list[torch.Tensor]:
    return resid_pre_grads(model, tokens, [(hp.name, fn) for hp, fn in rules], metric)


def _their_grads(model: Any, tokens: torch.Tensor, **options: Any) -> list[torch.Tensor]:
    kept: list[torch.Tensor] = []

    def keep(x: torch.Tensor, hook: Any) -> torch.Tensor:
        kept.append(x)
        return x

    hooks = [(f"blocks.{layer}.hook_resid_pre", keep) for layer in range(CFG.n_layers)]
    with torch.enable_grad(), gim.GIM(model, **{**NO_GATE, **options}), model.hooks(fwd_hooks=hooks):
        logits = model(tokens)
        return list(torch.autograd.grad(metric(logits), kept))


def _close(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    for layer, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        scale = b.abs().max()
        assert scale > 1e-6, f"layer {layer}: no gradient reached"
        torch.testing.assert_close(a, b, atol=1e-9 * float(scale) + 1e-12, rtol=1e-7)


NOTHING: dict[str, Any] = dict(freeze_norm=False, softmax_temperature=None, q_scale=None, k_scale=None, v_scale=None)
# gim-explain after 0.1.4 (its repository's head) adds gated-MLP gate/up scales, and its transformer-lens
# path hooks every `mlp.hook_pre` for the gate, a plain GELU MLP's too: GPT-2 has no gate, so off.
NO_GATE: dict[str, Any] = (
    dict(gate_scale=None, up_scale=None) if "gate_scale" in inspect.signature(gim.GIM).parameters else {}
)


def test_same_model_same_plain_gradients(pair):  # type: ignore[no-untyped-def]
    ours, theirs, tokens = pair
    _close(_our_grads(ours, tokens, []), _their_grads(theirs, tokens, **NOTHING))


@pytest.mark.parametrize(
    "theirs_opts, ours_opts",
    [
        ({}, {}),  # gim-explain's defaults: norm frozen, T = 2, q/k/v x 0.25 / 0.25 / 0.5
        ({**NOTHING, "freeze_norm": True}, dict(temperature=1.0, q_scale=1.0, k_scale=1.0, v_scale=1.0)),
        (
            {**NOTHING, "softmax_temperature": 3.0},
            dict(temperature=3.0, q_scale=1, k_scale=1, v_scale=1, freeze_norm=False),
        ),
        (
            {**NOTHING, "q_scale": 0.3, "k_scale": 0.7, "v_scale": 0.2},
            dict(temperature=1.0, q_scale=0.3, k_scale=0.7, v_scale=0.2, freeze_norm=False),
        ),
    ],
    ids=["defaults", "norm", "softmax", "qkv"],
)
def test_gim_gradients_equal_gim_explain(pair, theirs_opts, ours_opts):  # type: ignore[no-untyped-def]
    ours, theirs, tokens = pair
    got = _our_grads(ours, tokens, gim_rules(ours, **ours_opts))
    want = _their_grads(theirs, tokens, **theirs_opts)
    _close(got, want)
    plain = _their_grads(theirs, tokens, **NOTHING)
    assert not torch.allclose(want[0], plain[0], rtol=1e-3), "the modification changed nothing: the check can't fail"
