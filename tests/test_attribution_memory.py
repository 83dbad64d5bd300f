"""Attribution's memory: lazily loaded transcoders (interp_gpt.sae.mapped) give the graph an eager load gives,
and `estimate_memory` (interp_gpt.attribution.memory): its parts add up and grow as they should, it refuses
bad input by name, and `attribute(check_memory=True)` refuses a run that does not fit, naming what does."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from interp_gpt import GPT
from interp_gpt.attribution import attribute, estimate_memory
from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import (
    CLTConfig,
    CrossLayerTranscoder,
    Transcoder,
    TranscoderConfig,
    load_clt,
    load_transcoders,
    save_clt,
    save_transcoders,
)
from interp_gpt.sae.data import SHIPPED_CLT_DIR, SHIPPED_TRANSCODERS_DIR
from interp_gpt.sae.mapped import file_weight

pytestmark = pytest.mark.usefixtures("one_thread")
memory_module = importlib.import_module("interp_gpt.attribution.memory")
PROMPT = "The cat sat on the mat because"
TOKENS = torch.tensor([0, 5, 9, 17, 3, 42, 8, 61, 23, 7])


def topk_set(d: int, n: int, width: int = 48, k: int = 4, skip: bool = True) -> list[Transcoder]:
    """n random TopK transcoders (circuit-tracer's: negative values kept), with a skip."""
    out = []
    for layer in range(n):
        tc = Transcoder(
            TranscoderConfig(
                d_in=d, d_sae=width, d_out=d, architecture="topk", k=k, skip=skip, nonnegative_acts=False,
                metadata={"hook_name": f"blocks.{layer}.ln2.hook_normalized", "hook_name_out": f"blocks.{layer}.hook_mlp_out"},
            )
        )  # fmt: skip
        tc.init_weights(seed=layer)
        g = torch.Generator().manual_seed(50 + layer)
        with torch.no_grad():
            tc.b_enc.copy_(torch.randn(width, generator=g) * 0.1)
            tc.b_dec.copy_(torch.randn(d, generator=g) * 0.1)
            if skip:
                tc.W_skip.copy_(torch.randn(d, d, generator=g) * 0.1)
        out.append(tc)
    return out


def same_graph(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = (m.to_dense() if m.layout != torch.strided else m for m in (a, b))
    scale = float(b.abs().max())
    assert scale > 0
    assert float((a - b).abs().max()) <= 1e-6 * scale


# ----------------------------------------------------------------------------------------------
# Lazy == eager
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["saelens", "circuit-tracer"])
@pytest.mark.parametrize("lazy", [None, True])
def test_a_random_topk_set_on_disk_gives_the_same_graph_lazy_and_eager(
    tiny_model: GPT, tmp_path: Path, fmt, lazy
) -> None:  # type: ignore[no-untyped-def]
    folder = save_transcoders(topk_set(tiny_model.cfg.d_model, tiny_model.cfg.n_layers), tmp_path / "tcs", format=fmt)
    eager = load_transcoders(folder, lazy=False)
    mapped = load_transcoders(folder, lazy=lazy)
    assert all(file_weight(t, "W_enc") is None and file_weight(t, "W_dec") is None for t in eager)
    assert all(file_weight(t, "W_dec") is not None for t in mapped)  # read from its file, not memory
    enc_mapped = fmt == "saelens" or lazy is True  # circuit-tracer's W_enc is its transpose: mapped on lazy=True
    assert all((file_weight(t, "W_enc") is not None) == enc_mapped for t in mapped)
    file = folder / ("layer_0/sae_weights.safetensors" if fmt == "saelens" else "layer_0.safetensors")
    assert mapped[0].W_dec.untyped_storage().nbytes() == file.stat().st_size  # a view of the whole file's map
    for kw in ({}, {"max_feature_nodes": 20, "batch_size": 3}, {"sparse": True}):
        same_graph(attribute(tiny_model, TOKENS, mapped, **kw).adjacency_matrix,
                   attribute(tiny_model, TOKENS, eager, **kw).adjacency_matrix)  # fmt: skip


def test_the_shipped_transcoders_and_clt_give_the_same_graph_lazy_and_eager(tmp_path: Path) -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    for eager, lazy in [
        (load_transcoders(SHIPPED_TRANSCODERS_DIR, lazy=False), load_transcoders(SHIPPED_TRANSCODERS_DIR)),
        (load_clt(SHIPPED_CLT_DIR, lazy=False), load_clt(SHIPPED_CLT_DIR)),
    ]:
        same_graph(attribute(model, PROMPT, lazy).adjacency_matrix, attribute(model, PROMPT, eager).adjacency_matrix)
    assert all(file_weight(load_clt(SHIPPED_CLT_DIR), f"W_dec.{i}") is not None for i in range(2))


def test_a_topk_skip_clt_on_disk_gives_the_same_graph_lazy_and_eager(tiny_model: GPT, tmp_path: Path) -> None:
    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=n, d_in=d, d_sae=40, d_out=d, architecture="topk", k=5, skip=True, nonnegative_acts=False,
                  metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"})
    )  # fmt: skip
    clt.init_weights(seed=3)
    with torch.no_grad():
        clt.W_skip.copy_(torch.randn(clt.W_skip.shape, generator=torch.Generator().manual_seed(4)) * 0.1)
    folder = save_clt(clt, tmp_path / "clt")
    lazy, eager = load_clt(folder), load_clt(folder, lazy=False)
    assert file_weight(lazy, "W_dec.0") is not None and file_weight(eager, "W_dec.0") is None
    for kw in ({}, {"max_feature_nodes": 15}):
        same_graph(attribute(tiny_model, TOKENS, lazy, **kw).adjacency_matrix,
                   attribute(tiny_model, TOKENS, eager, **kw).adjacency_matrix)  # fmt: skip
    est_lazy, est_eager = (estimate_memory(tiny_model, c, len(TOKENS)) for c in (lazy, eager))
    assert est_lazy.n_features == attribute(tiny_model, TOKENS, lazy).active_features.shape[0] == 5 * 10 * n
    assert est_eager.weights - est_lazy.weights == sum(w.nbytes for w in eager.W_dec)  # the decoders stay on disk


def test_weights_changed_after_a_lazy_load_are_read_from_memory(tiny_model: GPT, tmp_path: Path) -> None:
    """A parameter written in place (or replaced) is no longer its file's: attribute reads the new values."""
    folder = save_transcoders(topk_set(tiny_model.cfg.d_model, tiny_model.cfg.n_layers), tmp_path / "tcs")
    lazy, eager = load_transcoders(folder), load_transcoders(folder, lazy=False)
    with torch.no_grad():
        for tcs in (lazy, eager):
            tcs[0].W_dec.mul_(2.0)
            tcs[1].W_enc[:, :5] = 0.0
    assert file_weight(lazy[0], "W_dec") is None and file_weight(lazy[1], "W_enc") is None
    assert file_weight(lazy[0], "W_enc") is not None  # untouched: still read from the file
    changed = attribute(tiny_model, TOKENS, eager).adjacency_matrix
    same_graph(attribute(tiny_model, TOKENS, lazy).adjacency_matrix, changed)
    assert load_file(str(folder / "layer_0" / "sae_weights.safetensors"))["W_dec"].abs().max() > 0  # file unchanged
    same_graph(attribute(tiny_model, TOKENS, load_transcoders(folder)).adjacency_matrix,
               attribute(tiny_model, TOKENS, load_transcoders(folder, lazy=False)).adjacency_matrix)  # fmt: skip


def test_a_lazy_load_still_refuses_non_finite_weights_and_bad_options(tiny_model: GPT, tmp_path: Path) -> None:
    folder = save_transcoders(topk_set(tiny_model.cfg.d_model, tiny_model.cfg.n_layers), tmp_path / "tcs")
    path = folder / "layer_1" / "sae_weights.safetensors"
    state = load_file(str(path))
    state["W_dec"][3, 2] = float("nan")
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"layer_1.*'W_dec' holds non-finite"):
        load_transcoders(folder)
    with pytest.raises(ValueError, match=r"lazy=True with device='meta'.*lazy=False"):
        load_transcoders(SHIPPED_TRANSCODERS_DIR, device="meta", lazy=True)
    with pytest.raises(TypeError, match=r"lazy='yes': expected True, False or None"):
        load_transcoders(SHIPPED_TRANSCODERS_DIR, lazy="yes")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# The estimate
# ----------------------------------------------------------------------------------------------
def test_the_estimate_adds_up_and_predicts_the_active_features(tiny_model: GPT) -> None:
    tcs = topk_set(tiny_model.cfg.d_model, tiny_model.cfg.n_layers)
    est = estimate_memory(tiny_model, tcs, len(TOKENS), batch_size=4)
    assert est.total == sum(est.parts().values()) and est.work == est.total - est.weights
    assert all(v >= 0 for v in est.parts().values())
    graph = attribute(tiny_model, TOKENS, tcs, batch_size=4)
    assert est.n_features == graph.active_features.shape[0]  # k per position and layer (no BOS: no tokenizer)
    assert est.n_nodes == graph.adjacency_matrix.shape[0]
    assert est.adjacency == 4 * est.n_nodes**2  # dense, every feature a node
    assert "MiB" in str(est) and "batch_size=4" in str(est)


def test_the_estimate_grows_with_batch_length_and_width(tiny_model: GPT, tmp_path: Path) -> None:
    d, n = tiny_model.cfg.d_model, tiny_model.cfg.n_layers
    tcs = topk_set(d, n)

    def est(length: int = 10, batch: int = 4, width: int = 48, **kw):  # type: ignore[no-untyped-def]
        return estimate_memory(
            tiny_model, tcs if width == 48 else topk_set(d, n, width), length, batch_size=batch, **kw
        )

    small, wide = est(), est(width=4096)
    # one copy's graph whatever the batch; the backward pass batched over it grows with the batch
    assert est(batch=8).forward == small.forward and est(batch=8).adjacency == small.adjacency
    assert est(batch=12).transient > est(batch=8).transient > small.transient
    longer = est(length=20)
    for part in ("forward", "features", "encoder_rows", "decoder_rows", "adjacency"):
        assert getattr(longer, part) > getattr(small, part), part
    # the dense activations [L, P, width] of phase 1 (then freed) and the weights grow with the width
    assert wide.transient > small.transient and wide.weights > small.weights
    assert est(max_feature_nodes=10).adjacency < small.adjacency
    sparse = est(length=30, sparse=True)
    assert sparse.sparse and sparse.adjacency < est(length=30, sparse=False).adjacency
    # lazily loaded: the matrices are not resident
    folder = save_transcoders(tcs, tmp_path / "tcs")
    lazy = estimate_memory(tiny_model, load_transcoders(folder), 10, batch_size=4)
    eager = estimate_memory(tiny_model, load_transcoders(folder, lazy=False), 10, batch_size=4)
    assert eager.weights - lazy.weights == sum(t.W_enc.nbytes + t.W_dec.nbytes for t in tcs)


def test_bad_input_to_the_estimate_is_named(tiny_model: GPT) -> None:
    tcs = topk_set(tiny_model.cfg.d_model, tiny_model.cfg.n_layers)
    n_ctx = tiny_model.cfg.n_ctx
    with pytest.raises(
        ValueError, match=rf"prompt_length={n_ctx + 1} is longer than the model's context, n_ctx={n_ctx}"
    ):
        estimate_memory(tiny_model, tcs, n_ctx + 1)
    with pytest.raises(ValueError, match=r"batch_size=0 is out of range"):
        estimate_memory(tiny_model, tcs, 10, batch_size=0)
    with pytest.raises(ValueError, match=r"prompt_length=0 is out of range"):
        estimate_memory(tiny_model, tcs, 0)
    relu = [
        Transcoder(TranscoderConfig(**{**t.cfg.__dict__, "architecture": "relu", "k": None, "nonnegative_acts": True}))
        for t in tcs
    ]
    with pytest.raises(ValueError, match=r"features_per_token=None: the transcoders are relu, not TopK"):
        estimate_memory(tiny_model, relu, 10)
    assert estimate_memory(tiny_model, relu, 10, features_per_token=3).n_features == 3 * 10 * len(tcs)


def test_attribute_refuses_a_run_that_does_not_fit_naming_what_does(tiny_model: GPT, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tcs = topk_set(tiny_model.cfg.d_model, tiny_model.cfg.n_layers)
    room = estimate_memory(tiny_model, tcs, len(TOKENS), batch_size=3).work + 1  # batch 3 fits, 16 does not
    monkeypatch.setattr(memory_module, "available_bytes", lambda device="cpu": room)
    with pytest.raises(
        ValueError, match=r"attribute: this run needs about .* batch_size=16.*pass batch_size=(\d+)"
    ) as e:
        attribute(tiny_model, TOKENS, tcs, batch_size=16)
    assert "check_memory=False" in str(e.value) and "forward" in str(e.value)  # the estimate's parts
    batch = int(re.search(r"pass batch_size=(\d+)", str(e.value)).group(1))  # type: ignore[union-attr]
    assert 3 <= batch < 16
    attribute(tiny_model, TOKENS, tcs, batch_size=batch)  # the batch size named fits
    assert attribute(tiny_model, TOKENS, tcs, batch_size=16, check_memory=False).n_features > 0  # told to go on
    # a long prompt at batch_size=1: only fewer feature nodes fit
    tokens = torch.arange(30) + 3
    room = estimate_memory(tiny_model, tcs, 30, batch_size=1, max_feature_nodes=40).work + 1
    monkeypatch.setattr(memory_module, "available_bytes", lambda device="cpu": room)
    with pytest.raises(
        ValueError, match=r"max_feature_nodes=None\) .* pass max_feature_nodes=(\d+), or check_memory"
    ) as e:
        attribute(tiny_model, tokens, tcs, batch_size=1)
    nodes = int(re.search(r"pass max_feature_nodes=(\d+)", str(e.value)).group(1))  # type: ignore[union-attr]
    assert 40 <= nodes < 120
    assert attribute(tiny_model, tokens, tcs, batch_size=1, max_feature_nodes=nodes).n_features == nodes
    with pytest.raises(TypeError, match=r"check_memory='no': expected True or False"):
        attribute(tiny_model, TOKENS, tcs, check_memory="no")  # type: ignore[arg-type]


def test_the_module_examples_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import doctest

    from interp_gpt.attribution import memory
    from interp_gpt.sae import mapped

    monkeypatch.chdir(tmp_path)  # mapped's example writes w.safetensors
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for module in (memory, mapped):
        for test in doctest.DocTestFinder(recurse=False).find(module):
            runner.run(test)
    assert runner.failures == 0 and runner.tries >= 6


def test_the_command_refuses_in_one_line_unless_told_to_go_on(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from interp_gpt.cli import main

    monkeypatch.setattr(memory_module, "available_bytes", lambda device="cpu": 1)
    argv = ["attribute", "tiny-gpt2", PROMPT, "--transcoders", "shipped", "--out", str(tmp_path / "g.html")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "this run needs about" in err and "check_memory=False" in err and len(err.strip().splitlines()) == 1
    assert main([*argv, "--no-check-memory"]) == 0 and (tmp_path / "g.html").is_file()
