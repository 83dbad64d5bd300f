"""RelP's rules (`interp_gpt.circuits.rules.relp_rules`) against RelP's own code: its TransformerLens
fork (github.com/FarnoushRJ/RelP, `TransformerLens/transformer_lens`) with `cfg.use_lrp = True`, holding
the same random weights: the metric's gradient at every layer's residual stream is the same, with the
fork's default rules and with its AH-rule added. Skips unless the `transformer_lens` on the path is
that fork (it has `lrp_utils.py`), e.g.

    PYTHONPATH=<RelP>/TransformerLens python -m pytest tests/test_circuits_relp.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import Config
from interp_gpt.circuits.rules import relp_rules

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import random_model, resid_pre_grads  # noqa: E402


def _is_relp_fork() -> bool:
    spec = importlib.util.find_spec("transformer_lens")  # finds the package without importing it
    places = spec.submodule_search_locations if spec is not None else None
    return bool(places) and any((Path(p) / "lrp_utils.py").exists() for p in places)  # type: ignore[union-attr]


pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(not _is_relp_fork(), reason="needs RelP's TransformerLens fork as transformer_lens"),
]

CFG = Config(n_layers=3, d_model=32, n_heads=4, d_vocab=50, n_ctx=16)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].sum() - logits[:, -1, 5].sum() + 0.1 * logits[:, :, 7].sum()


def _fork(ours: Any, rules: list[str]) -> Any:
    """RelP's HookedTransformer with our weights, in float64, `LRP_rules = rules`."""
    import transformers

    if not hasattr(transformers, "TRANSFORMERS_CACHE"):  # the fork reads it at import; transformers 5 dropped it
        transformers.TRANSFORMERS_CACHE = str(Path.home() / ".cache" / "huggingface")  # type: ignore[attr-defined]
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    c = ours.cfg
    tl_cfg = HookedTransformerConfig(
        n_layers=c.n_layers, d_model=c.d_model, n_heads=c.n_heads, d_head=c.d_head, d_mlp=c.d_mlp,
        d_vocab=c.d_vocab, n_ctx=c.n_ctx, act_fn=c.act_fn, eps=c.layer_norm_eps, normalization_type="LN",
        dtype=torch.float64, use_lrp=True,
    )  # fmt: skip
    tl_cfg.LRP_rules = rules  # read as the model is built (the activation) and in each forward (AH)
    theirs = HookedTransformer(tl_cfg)
    weights = {k: v for k, v in ours.state_dict().items() if not k.endswith((".IGNORE", ".mask"))}
    missing, unexpected = theirs.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith((".IGNORE", ".mask")) for k in missing), (missing, unexpected)
    return theirs.eval()


def _grads(model: Any, tokens: torch.Tensor, extra: list[tuple[str, Any]]) -> list[torch.Tensor]:
    return resid_pre_grads(model, tokens, extra, metric)


@pytest.mark.parametrize("ah_rule", [False, True], ids=["default", "ah_rule"])
def test_relp_gradients_equal_relp_code(ah_rule):  # type: ignore[no-untyped-def]
    ours = random_model(CFG, seed=6)
    with torch.no_grad():  # random_model's x5 weights saturate the softmax: tone them down a little
        for name, p in ours.named_parameters():
            if name.split(".")[-1].startswith("W_"):
                p.mul_(0.4)
    tokens = torch.randint(0, CFG.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    theirs = _fork(ours, ["LN-rule", "Identity-rule", "Half-rule"] + (["AH-rule"] if ah_rule else []))
    got = _grads(ours, tokens, [(hp.name, fn) for hp, fn in relp_rules(ours, ah_rule=ah_rule)])
    want = _grads(theirs, tokens, [])
    plain = _grads(ours, tokens, [])
    for layer, (a, b) in enumerate(zip(got, want, strict=True)):
        scale = float(b.abs().max())
        assert scale > 1e-6, f"layer {layer}: no gradient reached"
        torch.testing.assert_close(a, b, atol=1e-9 * scale, rtol=1e-7)
    assert not torch.allclose(want[0], plain[0], rtol=1e-3)  # the rules changed the gradient: the check can fail
