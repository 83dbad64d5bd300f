"""`feature_intervention` / `feature_intervention_generate` against an independent reference built from
plain hooks on the unspliced model: each layer's reading is relu(x @ W_enc + b_enc) of its MLP input
(position 0 read as 0); at an intervened layer, (value - reading) x W_dec (a CLT: its decoder rows into
that layer and every later one) is added to `hook_mlp_out`; with freeze_attention the attention patterns
are the clean run's. Plus: setting features to their own values changes nothing, and what freezing the
attention patterns does and does not change.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_attribution import TOKENS, a_clt, plts

from interp_gpt import GPT
from interp_gpt.attribution import feature_intervention, feature_intervention_generate
from interp_gpt.sae import CrossLayerTranscoder


def reference(
    model: GPT, tcs: Any, ivs: list, freeze: bool, constrained: range | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain hooks; `constrained`: those layers' MLP outputs (and, all layers, the LayerNorm scales) are the
    clean run's, the deltas are taken from the clean readings and only those layers take them."""
    n = model.cfg.n_layers
    is_clt = isinstance(tcs, CrossLayerTranscoder)
    assert (tcs.cfg.architecture if is_clt else tcs[0].cfg.architecture) == "relu"
    assert constrained is None or not (is_clt or tcs[0].cfg.skip)  # (the reference has no skip term)
    ends = ("hook_pattern", "hook_mlp_out", "hook_scale", "ln2.hook_normalized")
    with torch.no_grad():
        _, clean = model.run_with_cache(TOKENS[None], names_filter=lambda name: name.endswith(ends))
    readings: list[torch.Tensor] = [torch.empty(0)] * n
    pending = [torch.zeros(len(TOKENS), model.cfg.d_model) for _ in range(n)]

    def encode(x: torch.Tensor, layer: int) -> torch.Tensor:
        W, b = (tcs.W_enc[layer], tcs.b_enc[layer]) if is_clt else (tcs[layer].W_enc, tcs[layer].b_enc)
        r = F.relu(x[0] @ W + b)
        r[: 1 if model.tokenizer is not None else 0] = 0  # the BOS; no BOS is put first without a tokenizer
        return r

    def read(x: torch.Tensor, hook: Any, layer: int) -> None:
        r = readings[layer] = encode(x, layer)
        if constrained is not None:
            r = encode(clean[f"blocks.{layer}.ln2.hook_normalized"], layer)
        delta = torch.zeros_like(r)
        for lay, pos, feat, value in ivs:
            if lay == layer:
                delta[pos, feat] = value - r[pos, feat]
        for target in range(layer, n):
            if is_clt:
                pending[target] += delta @ tcs.W_dec[layer][:, target - layer]
            elif target == layer:
                pending[target] += delta @ tcs[layer].W_dec

    def write(out: torch.Tensor, hook: Any, layer: int) -> torch.Tensor:
        if constrained is None:
            return out + pending[layer][None]
        if layer not in constrained:
            return out
        return clean[f"blocks.{layer}.hook_mlp_out"] + pending[layer][None]

    hooks: list = []
    for layer in range(n):
        hooks.append((f"blocks.{layer}.ln2.hook_normalized", lambda x, hook, layer=layer: read(x, hook, layer)))
        hooks.append((f"blocks.{layer}.hook_mlp_out", lambda x, hook, layer=layer: write(x, hook, layer)))
        frozen = [f"blocks.{layer}.attn.hook_pattern"] if freeze or constrained is not None else []
        if constrained is not None and set(constrained) == set(range(n)):
            frozen += [f"blocks.{layer}.ln1.hook_scale", f"blocks.{layer}.ln2.hook_scale"]
        for name in frozen:
            hooks.append((name, lambda x, hook, name=name: clean[name]))
    if constrained is not None and set(constrained) == set(range(n)):
        hooks.append(("ln_final.hook_scale", lambda x, hook: clean["ln_final.hook_scale"]))
    with torch.no_grad():
        logits = model.run_with_hooks(TOKENS[None], fwd_hooks=hooks)
    return logits, torch.stack(readings)


IVS = [(0, 3, 5, 2.0), (0, 0, 7, 1.5), (0, slice(4, None), 11, 0.0), (1, 6, 2, 3.0), (1, 6, 2, -1.0)]


@pytest.mark.parametrize("freeze", [True, False])
@pytest.mark.parametrize("which", ["plt", "plt-skip", "clt-skip"])
def test_equals_plain_hook_reference(tiny_model: GPT, which: str, freeze: bool) -> None:
    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    tcs = a_clt(d, n, skip=True) if which == "clt-skip" else plts(d, n, skip=which.endswith("skip"))
    ivs = [(lay, pos, feat % 30, v) for lay, pos, feat, v in IVS]
    ref_logits, ref_acts = reference(tiny_model, tcs, ivs, freeze)
    logits, acts = feature_intervention(tiny_model, TOKENS, tcs, ivs, freeze_attention=freeze)
    assert acts is not None
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(acts, ref_acts, rtol=1e-5, atol=1e-5)
    clean, _ = feature_intervention(tiny_model, TOKENS, tcs, [])
    assert float((clean - logits).abs().max()) > 1e-3
    _, sparse = feature_intervention(tiny_model, TOKENS, tcs, ivs, freeze_attention=freeze, sparse=True)
    assert sparse is not None and sparse.is_sparse and torch.equal(sparse.to_dense(), acts)


@pytest.mark.parametrize("constrained", [range(2), range(1, 2), range(0, 1)])
def test_constrained_layers_equal_plain_hook_reference(tiny_model: GPT, constrained: range) -> None:
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=False)
    ivs = [(0, 3, 5, 2.0), (0, 0, 7, 1.5), (1, 6, 2, 3.0), (1, slice(2, None), 9, 0.0)]
    ref_logits, ref_acts = reference(tiny_model, tcs, ivs, True, constrained)
    logits, acts = feature_intervention(tiny_model, TOKENS, tcs, ivs, constrained_layers=constrained)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(acts, ref_acts, rtol=1e-5, atol=1e-5)
    free, _ = feature_intervention(tiny_model, TOKENS, tcs, ivs)
    assert float((free - logits).abs().max()) > 1e-4  # constraining changes the answer


def test_own_values_change_nothing(tiny_model: GPT) -> None:
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=True)
    clean_logits, clean_acts = feature_intervention(tiny_model, TOKENS, tcs, [])
    assert clean_acts is not None and bool((clean_acts[:, 1:] > 0).any())
    with torch.no_grad():
        plain = tiny_model(TOKENS[None])
    torch.testing.assert_close(clean_logits, plain, rtol=1e-6, atol=1e-6)  # hooked LayerNorm: unfused
    everything = torch.arange(40)
    ivs = [(layer, pos, everything, clean_acts[layer, pos]) for layer in range(2) for pos in range(1, len(TOKENS))]
    for freeze in (True, False):
        logits, acts = feature_intervention(tiny_model, TOKENS, tcs, ivs, freeze_attention=freeze)
        torch.testing.assert_close(logits, clean_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(acts, clean_acts, rtol=1e-5, atol=1e-5)


def test_what_freezing_the_attention_changes(tiny_model: GPT) -> None:
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=False)
    clean, _ = feature_intervention(tiny_model, TOKENS, tcs, [])
    # layer 0's MLP output feeds layer 1's attention: freezing its patterns changes the result
    early = [(0, 4, 5, 6.0)]
    frozen, _ = feature_intervention(tiny_model, TOKENS, tcs, early, freeze_attention=True)
    live, _ = feature_intervention(tiny_model, TOKENS, tcs, early, freeze_attention=False)
    assert float((frozen - live)[0, 5:].abs().max()) > 1e-4
    # ... but not before the intervened position (causal), where both equal the clean run
    for out in (frozen, live):
        torch.testing.assert_close(out[0, :4], clean[0, :4], rtol=1e-6, atol=1e-6)
    # the last layer's MLP comes after every attention: no pattern moves, freezing changes nothing
    late = [(1, 4, 5, 6.0)]
    frozen, _ = feature_intervention(tiny_model, TOKENS, tcs, late, freeze_attention=True)
    live, _ = feature_intervention(tiny_model, TOKENS, tcs, late, freeze_attention=False)
    torch.testing.assert_close(frozen, live, rtol=1e-6, atol=1e-6)
    assert float((frozen - clean).abs().max()) > 1e-3


def test_generation_holds_open_ended_interventions(tiny_model: GPT) -> None:
    tcs = plts(tiny_model.cfg.d_model, tiny_model.cfg.n_layers, skip=False)
    kw: dict[str, Any] = {"max_new_tokens": 4, "stop_at_eos": False}
    plain = tiny_model.generate(TOKENS[None], do_sample=False, **kw)
    tokens, logits, acts = feature_intervention_generate(tiny_model, TOKENS, tcs, [], **kw)
    assert torch.equal(tokens, plain) and logits.shape == (4, tiny_model.cfg.d_vocab)
    assert acts is not None and acts.shape == (2, len(TOKENS) + 3, 40)
    # the first step is feature_intervention's last position
    ivs = [(1, slice(2, None), 5, 8.0), (0, 3, 7, 2.0)]
    tokens, logits, acts = feature_intervention_generate(tiny_model, TOKENS, tcs, ivs, **kw)
    one, one_acts = feature_intervention(tiny_model, TOKENS, tcs, ivs)
    torch.testing.assert_close(logits[0], one[0, -1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(acts[:, : len(TOKENS)], one_acts, rtol=1e-5, atol=1e-5)
    # each new token carries the open-ended intervention: equal to a full intervened pass over the
    # generated tokens, unfrozen, with the open-ended one at every new position (the prompt's positions
    # as the first pass left them: the cached keys and values)
    closed = [(1, slice(2, len(TOKENS)), 5, 8.0), (0, 3, 7, 2.0)]
    _, plain_logits, _ = feature_intervention_generate(tiny_model, TOKENS, tcs, closed, **kw)
    assert float((plain_logits[1:] - logits[1:]).abs().max()) > 1e-3
    torch.testing.assert_close(plain_logits[0], logits[0], rtol=1e-6, atol=1e-6)


def test_the_docstring_example_runs() -> None:
    import doctest
    import importlib

    module = importlib.import_module("interp_gpt.attribution.intervention")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = doctest.DocTestFinder(recurse=False).find(module)
    assert sum(len(t.examples) for t in tests) >= 6
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
