"""Feature interventions equal to circuit-tracer 0.5.0's `feature_intervention` and
`feature_intervention_generate` on a random GPT-2's raw weights, with random transcoders of every kind
it supports (per-layer ReLU, JumpReLU, TopK, with and without skip; cross-layer ReLU, JumpReLU).

Built as tests/test_attribution_circuit_tracer.py builds them (its helpers imported). Compared: the
logits and the activations to 1e-4 (two float32 forward passes), and generation's greedy tokens.
Run in circuit-tracer's own venv (.venv-ct, see .ci/run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("circuit_tracer", reason="circuit-tracer 0.5 needs its own venv (.venv-ct, see .ci/run)")
from test_attribution_circuit_tracer import TOKENS, clt, our_model, plts, their_model  # noqa: E402

from interp_gpt.attribution import feature_intervention, feature_intervention_generate  # noqa: E402

TOL = 1e-4


def interventions(n_layers: int) -> list:
    last = n_layers - 1
    return [
        (0, 3, 5, 2.0),
        (0, 0, 7, 1.5),  # position 0: circuit-tracer reads it as 0
        (0, slice(1, None), 11, -1.0),  # open-ended: held on generated tokens
        (last, slice(2, 6), 13, 0.0),
        (last, 5, torch.tensor([1, 2, 3]), torch.tensor([3.0, -2.0, 0.5])),
        (last, 4, 13, 4.0),  # later interventions at the same place win
    ]


def assert_close(mine: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    assert mine.shape == ref.shape, (what, mine.shape, ref.shape)
    diff = float((mine - ref.float()).abs().max())
    assert diff <= TOL * max(1.0, float(ref.abs().max())), f"{what} differs by {diff}"
    return diff


def compare(hf_model, hf_checkpoint_dir: Path, theirs_tc, mine_tc, label: str) -> None:  # type: ignore[no-untyped-def]
    theirs = their_model(hf_model, theirs_tc)
    model = our_model(hf_checkpoint_dir)
    ivs = interventions(model.cfg.n_layers)
    for freeze in (True, False):
        for post in (True, False):
            ref_logits, ref_acts = theirs.feature_intervention(
                TOKENS, ivs, freeze_attention=freeze, apply_activation_function=post
            )
            logits, acts = feature_intervention(
                model, TOKENS, mine_tc, ivs, freeze_attention=freeze, apply_activation_function=post
            )
            d_l = assert_close(logits, ref_logits, f"{label} logits freeze={freeze}")
            d_a = assert_close(acts, ref_acts, f"{label} activations freeze={freeze} post={post}")
            print(label, f"freeze={freeze} post={post}", "max |d logits|", d_l, "max |d acts|", d_a)
    n = model.cfg.n_layers
    for constrained in (range(n), range(n - 1, n), range(0, 1)):  # all layers (direct effects), the last, the first
        ref_logits, ref_acts = theirs.feature_intervention(TOKENS, ivs, constrained_layers=constrained)
        logits, acts = feature_intervention(model, TOKENS, mine_tc, ivs, constrained_layers=constrained)
        d_l = assert_close(logits, ref_logits, f"{label} logits constrained={constrained}")
        d_a = assert_close(acts, ref_acts, f"{label} activations constrained={constrained}")
        print(label, f"constrained={constrained}", "max |d logits|", d_l, "max |d acts|", d_a)
    ref_sparse = theirs.feature_intervention(TOKENS, ivs, sparse=True)[1]
    mine_sparse = feature_intervention(model, TOKENS, mine_tc, ivs, sparse=True)[1]
    assert mine_sparse.is_sparse and ref_sparse.is_sparse
    assert_close(mine_sparse.to_dense(), ref_sparse.to_dense(), f"{label} sparse activations")
    clean, _ = feature_intervention(model, TOKENS, mine_tc, [])
    moved, _ = feature_intervention(model, TOKENS, mine_tc, ivs)
    assert float((clean - moved).abs().max()) > 1e-3  # the interventions do something


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("kind", ["relu", "jumprelu", "topk"])
def test_plt_intervention_equals_circuit_tracers(hf_model, hf_checkpoint_dir: Path, kind: str, skip: bool) -> None:  # type: ignore[no-untyped-def]
    n, d = hf_model.config.n_layer, hf_model.config.n_embd
    tset, mine = plts(kind, skip, d, n, seed=13)
    compare(hf_model, hf_checkpoint_dir, tset, mine, f"plt {kind} skip={skip}")


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("kind", ["relu", "jumprelu"])
def test_clt_intervention_equals_circuit_tracers(hf_model, hf_checkpoint_dir: Path, kind: str, skip: bool) -> None:  # type: ignore[no-untyped-def]
    n, d = hf_model.config.n_layer, hf_model.config.n_embd
    theirs, mine = clt(kind, skip, d, n, seed=14)
    compare(hf_model, hf_checkpoint_dir, theirs, mine, f"clt {kind} skip={skip}")


@pytest.mark.parametrize("which", ["relu-skip", "topk", "clt"])
def test_generation_equals_circuit_tracers(hf_model, hf_checkpoint_dir: Path, which: str) -> None:  # type: ignore[no-untyped-def]
    n, d = hf_model.config.n_layer, hf_model.config.n_embd
    if which == "clt":
        theirs_tc, mine = clt("relu", True, d, n, seed=15)
    else:
        theirs_tc, mine = plts(which.split("-")[0], which.endswith("skip"), d, n, seed=15)
    theirs = their_model(hf_model, theirs_tc)
    model = our_model(hf_checkpoint_dir)
    ivs = interventions(n)
    ref_tokens, ref_logits, ref_acts = theirs.feature_intervention_generate(
        TOKENS[None], ivs, max_new_tokens=5, do_sample=False, stop_at_eos=False, verbose=False
    )
    tokens, logits, acts = feature_intervention_generate(model, TOKENS, mine, ivs, max_new_tokens=5, stop_at_eos=False)
    assert torch.equal(tokens.cpu(), ref_tokens.cpu())
    ref_c = theirs.feature_intervention_generate(
        TOKENS[None],
        ivs,
        constrained_layers=range(n),
        max_new_tokens=5,
        do_sample=False,
        stop_at_eos=False,
        verbose=False,
    )
    mine_c = feature_intervention_generate(
        model, TOKENS, mine, ivs, constrained_layers=range(n), max_new_tokens=5, stop_at_eos=False
    )
    assert torch.equal(mine_c[0].cpu(), ref_c[0].cpu())
    print(
        "generate constrained",
        which,
        assert_close(mine_c[1], ref_c[1], "logits"),
        assert_close(mine_c[2], ref_c[2], "acts"),
    )
    d_l = assert_close(logits, ref_logits, f"generation {which} logits")
    d_a = assert_close(acts, ref_acts, f"generation {which} activations")
    print("generate", which, "max |d logits|", d_l, "max |d acts|", d_a)
    # the open-ended intervention changes the continuation's logits beyond the first step
    _, plain_logits, _ = feature_intervention_generate(
        model, TOKENS, mine, ivs[:2], max_new_tokens=5, stop_at_eos=False
    )
    assert float((plain_logits[1:] - logits[1:]).abs().max()) > 1e-4
