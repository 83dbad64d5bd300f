"""Issue 36, pass 3: transcoders used on re-loaded, re-cast and re-saved models and folders give the
numbers of the model as loaded fresh, or a clear refusal naming what to do; never a stale answer."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.cli import main as cli_main
from interp_gpt.sae import (
    Transcoder,
    TranscoderConfig,
    load_clt,
    load_transcoders,
    model_processing,
    save_clt,
    save_transcoders,
)
from interp_gpt.sae.training.data import SHIPPED_TRANSCODERS_DIR, shipped_clt, shipped_sae, shipped_transcoders
from interp_gpt.sae.transcoders.evaluation import evaluate_transcoders
from interp_gpt.sae.transcoders.io import transcoders_scan

RAW = {"fold_ln": False, "center_writing_weights": False}


def _raw_tc(model: GPT, layer: int, hook_in: str = "mlp.hook_in", processing: Any = "raw") -> Transcoder:
    d = model.cfg.d_model
    meta = {"hook_name": f"blocks.{layer}.{hook_in}", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
    cfg = TranscoderConfig(
        d_in=d, d_sae=48, d_out=d, architecture="relu", skip=True, metadata={**meta, "model_processing": processing}
    )
    tc = Transcoder(cfg)
    tc.init_weights(seed=layer)
    return tc


def _other_checkpoint() -> GPT:
    """tiny-gpt2's raw weights with other ln2 weights and biases: another checkpoint of the same shape."""
    other = GPT.from_pretrained_no_processing("tiny-gpt2")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in other.blocks:
            block.ln2.w.mul_(1 + 0.3 * torch.randn(block.ln2.w.shape, generator=gen))
            block.ln2.b.add_(0.3 * torch.randn(block.ln2.b.shape, generator=gen))
    return other


# ----- 8b: load_and_process_state_dict records the LayerNorms of what it loaded ---------------------
def test_reloaded_processed_model_converts_raw_transcoders_with_the_new_checkpoints_ln2() -> None:
    other = _other_checkpoint()
    model = GPT.from_pretrained("tiny-gpt2")  # processed: folded_layer_norms are tiny-gpt2's
    model.load_and_process_state_dict(other.state_dict())
    fresh = GPT.from_pretrained_no_processing("tiny-gpt2")
    fresh.load_state_dict(other.state_dict())
    fresh.process_weights_()
    for layer in range(model.cfg.n_layers):
        key = f"blocks.{layer}.ln2.w"
        torch.testing.assert_close(model.folded_layer_norms[key], fresh.folded_layer_norms[key])
        tc = _raw_tc(model, layer)
        a, b = tc.converted_to(model), tc.converted_to(fresh)
        for name in ("W_enc", "b_enc", "W_skip", "b_dec"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-6, atol=1e-6)


def test_process_weights_again_keeps_the_checkpoints_ln2() -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    before = {k: v.clone() for k, v in model.folded_layer_norms.items()}
    model.process_weights_()  # its own weights, folded already: still tiny-gpt2's LayerNorms
    assert set(model.folded_layer_norms) == set(before)
    for k, v in before.items():
        torch.testing.assert_close(model.folded_layer_norms[k], v)


def test_loading_a_folded_state_dict_forgets_the_old_ln2_and_refuses_raw_transcoders_by_name() -> None:
    other = _other_checkpoint()
    other.process_weights_()  # folded: its state dict holds no LayerNorm weights
    model = GPT.from_pretrained("tiny-gpt2")
    model.load_and_process_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="folded_layer_norms"):
        _raw_tc(model, 1).converted_to(model)


# ----- 8c: evaluate_transcoders measures what the splice computes -----------------------------------
def _as_raw_mlp_in(model: GPT, tc: Transcoder) -> Transcoder:
    """The same function as `tc` (processed, reading ln2.hook_normalized = x_hat), written for the MLP's
    raw input y = x_hat * w + b (fold_ln=False, mlp.hook_in): W_enc' = diag(1/w) W_enc, and so on."""
    layer = tc.layer
    w = model.folded_layer_norms[f"blocks.{layer}.ln2.w"].double()
    b = model.folded_layer_norms[f"blocks.{layer}.ln2.b"].double()
    new = copy.deepcopy(tc)
    s = b / w
    with torch.no_grad():
        W, skip = tc.W_enc.double(), tc.W_skip.double()
        new.W_enc.copy_(W / w[:, None])
        new.b_enc.copy_(tc.b_enc.double() - s @ W)
        new.W_skip.copy_(skip / w[None, :])
        new.b_dec.copy_(tc.b_dec.double() - skip @ s)
    new.cfg.metadata["hook_name"] = f"blocks.{layer}.mlp.hook_in"
    new.cfg.metadata["model_processing"] = {"fold_ln": False, "center_writing_weights": True}
    return new


@pytest.fixture(scope="module")
def processed() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def eval_tokens(processed: GPT) -> torch.Tensor:
    return torch.randint(0, processed.cfg.d_vocab, (6, 24), generator=torch.Generator().manual_seed(0))


_METRICS = ("l0_per_layer", "explained_variance_per_layer", "mse_per_layer", "ce_spliced", "dead_fraction")


def _assert_same_metrics(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in _METRICS:
        assert b[key] == pytest.approx(a[key], rel=1e-3), key


def test_evaluate_transcoders_on_mlp_hook_in_equals_the_equivalent_set(processed: GPT, eval_tokens: Any) -> None:
    tcs = shipped_transcoders(processed)
    alt = [_as_raw_mlp_in(processed, tc) for tc in tcs]
    want = evaluate_transcoders(processed, tcs, eval_tokens)
    got = evaluate_transcoders(processed, alt, eval_tokens)
    assert got["ce_spliced"] == pytest.approx(want["ce_spliced"], rel=1e-4)  # the same function, spliced
    _assert_same_metrics(want, got)


def test_evaluate_transcoders_takes_a_clt_reading_mlp_hook_in(processed: GPT, eval_tokens: Any) -> None:
    clt = shipped_clt()  # processed weights: there the MLP's input is ln2.hook_normalized
    assert clt.cfg.metadata["hook_name"] == "ln2.hook_normalized"
    alt = copy.deepcopy(clt)
    alt.cfg.metadata["hook_name"] = "mlp.hook_in"  # circuit-tracer's name for the same activation
    _assert_same_metrics(
        evaluate_transcoders(processed, clt, eval_tokens), evaluate_transcoders(processed, alt, eval_tokens)
    )


# ----- 8e: centring judged at the precision the weights hold -----------------------------------------
@pytest.mark.parametrize("cast", [[torch.float64], [torch.bfloat16, torch.float32], [torch.float16, torch.float32]])
def test_a_processed_model_cast_up_is_still_centred(cast: list[torch.dtype]) -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    for dtype in cast:
        model = model.to(dtype)
    for layer in range(model.cfg.n_layers):
        assert model_processing(model, layer) == {"fold_ln": True, "center_writing_weights": True}
    tcs = shipped_transcoders(model)  # accepted, as on the float32 model: nothing to convert
    assert [tc.cfg.processing for tc in tcs] == [{"fold_ln": True, "center_writing_weights": True}] * 2
    shipped_clt().converted_to(model)


@pytest.mark.parametrize("cast", [[torch.float64], [torch.bfloat16, torch.float32]])
def test_a_raw_model_cast_up_is_still_not_centred(cast: list[torch.dtype]) -> None:
    model = GPT.from_pretrained_no_processing("tiny-gpt2")
    for dtype in cast:
        model = model.to(dtype)
    assert model_processing(model, 1) == RAW


def test_a_raw_resid_mid_transcoder_is_refused_on_the_float64_model_as_on_the_float32_one() -> None:
    f32 = GPT.from_pretrained("tiny-gpt2")
    f64 = GPT.from_pretrained("tiny-gpt2").to(torch.float64)
    tc = _raw_tc(f32, 1, "hook_resid_mid")  # reads the mean over d_model that centring took away
    for model in (f32, f64):
        with pytest.raises(ValueError, match="reads that mean"):
            tc.to(model.W_E.dtype).converted_to(model)


# ----- 8f: only a transcoder set of that kind is replaced, by what its files say --------------------
def _experiment(folder: Path) -> dict[str, str]:
    """An experiment's own folder: a config.yaml and a metrics.json that are no transcoder's."""
    folder.mkdir(parents=True)
    files = {"config.yaml": "lr: 0.001\nmodel: gpt2\n", "metrics.json": '{"loss": 0.5, "kind": "plt"}\n'}
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


def _untouched(folder: Path, files: dict[str, str]) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for name, text in files.items():
        assert (folder / name).read_text() == text


@pytest.mark.parametrize("fmt", ["saelens", "circuit-tracer"])
def test_save_transcoders_refuses_an_experiment_folder_and_an_saes_folder(tmp_path: Path, fmt: str) -> None:
    tcs = shipped_transcoders()
    files = _experiment(tmp_path / "run")
    with pytest.raises(FileExistsError, match=r"path=.*run'.*\(config.yaml\).*save into a new or empty folder"):
        save_transcoders(tcs, tmp_path / "run", format=fmt)
    _untouched(tmp_path / "run", files)
    shipped_sae().save_model(tmp_path / "sae")  # cfg.json + sae_weights.safetensors: an SAE's, not a transcoder's
    saved = {p.name: p.read_bytes() for p in (tmp_path / "sae").iterdir()}
    with pytest.raises(FileExistsError, match=r"\(cfg.json\): cfg.json is not a transcoder's"):
        save_transcoders(tcs, tmp_path / "sae", format=fmt)
    assert {p.name: p.read_bytes() for p in (tmp_path / "sae").iterdir()} == saved


def test_save_clt_refuses_an_experiment_folder_and_a_per_layer_set(tmp_path: Path) -> None:
    clt = shipped_clt()
    files = _experiment(tmp_path / "run")
    with pytest.raises(FileExistsError, match=r"save_clt: path=.*\(config.yaml\)"):
        save_clt(clt, tmp_path / "run")
    _untouched(tmp_path / "run", files)
    save_transcoders(shipped_transcoders(), tmp_path / "plts", format="circuit-tracer")
    with pytest.raises(FileExistsError, match=r"config.yaml is not circuit-tracer's config of a cross-layer"):
        save_clt(clt, tmp_path / "plts")
    clt_dir = save_clt(clt, tmp_path / "clt")
    with pytest.raises(FileExistsError, match=r"is no part of a per-layer transcoder set"):
        save_transcoders(shipped_transcoders(), clt_dir, format="circuit-tracer")


def test_a_set_is_still_replaced_by_a_set_of_its_kind(tmp_path: Path) -> None:
    tcs = shipped_transcoders()
    out = tmp_path / "set"
    save_transcoders(tcs, out)
    shutil.copy(SHIPPED_TRANSCODERS_DIR / "metrics.json", out / "metrics.json")  # train-transcoder's
    save_transcoders(tcs, out / "last_good")
    save_transcoders(tcs, out, format="circuit-tracer")  # replaces the sae-lens set, metrics and last_good
    assert (out / "config.yaml").is_file() and not (out / "layer_0").exists()
    save_transcoders(tcs, out)
    clt_dir = save_clt(shipped_clt(), tmp_path / "clt")
    save_clt(shipped_clt(), clt_dir)
    assert (clt_dir / "config.yaml").is_file()


def test_train_transcoder_refuses_an_saes_out_before_loading_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import interp_gpt.loading

    def _no(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("work began before --out was checked")

    monkeypatch.setattr(interp_gpt.loading, "from_pretrained", _no)
    shipped_sae().save_model(tmp_path / "sae")
    saved = {p.name: p.read_bytes() for p in (tmp_path / "sae").iterdir()}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("hello world\n" * 50)
    argv = ["train-transcoder", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "sae"), "--no-progress"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "--out=" in err and "(cfg.json): cfg.json is not a transcoder's" in err, err
    assert {p.name: p.read_bytes() for p in (tmp_path / "sae").iterdir()} == saved


# ----- the scan: circuit-tracer's name of a set, kept on the loaded set ------------------------------
def _add_scan(config: Path, scan: str) -> None:
    config.write_text(config.read_text(encoding="utf-8") + f"scan: {scan}\n", encoding="utf-8")


def test_a_circuit_tracer_sets_scan_is_kept_on_the_loaded_set_and_saved_again(tmp_path: Path) -> None:
    folder = save_transcoders(shipped_transcoders(), tmp_path / "set", format="circuit-tracer")
    _add_scan(folder / "config.yaml", "tiny-gpt2-skip")
    tcs = load_transcoders(folder)
    assert [tc.cfg.metadata["scan"] for tc in tcs] == ["tiny-gpt2-skip"] * 2
    assert transcoders_scan(tcs) == "tiny-gpt2-skip"
    again = save_transcoders(tcs, tmp_path / "again", format="circuit-tracer")
    assert transcoders_scan(load_transcoders(again)) == "tiny-gpt2-skip"
    clt_dir = save_clt(shipped_clt(), tmp_path / "clt")
    _add_scan(clt_dir / "config.yaml", "tiny-gpt2-clt")
    clt = load_clt(clt_dir)
    assert transcoders_scan(clt) == "tiny-gpt2-clt"
    assert transcoders_scan(load_clt(save_clt(clt, tmp_path / "clt2"))) == "tiny-gpt2-clt"
    assert transcoders_scan(shipped_transcoders()) is None


def test_a_graph_made_with_a_scanned_set_carries_its_scan_into_the_json(tmp_path: Path) -> None:
    from interp_gpt.attribution import attribute, to_json

    model = GPT.from_pretrained("tiny-gpt2")
    folder = save_transcoders(shipped_transcoders(model), tmp_path / "set", format="circuit-tracer")
    _add_scan(folder / "config.yaml", "tiny-gpt2-skip")
    graph = attribute(model, "Once upon a time", load_transcoders(folder, model), batch_size=64)
    assert graph.scan == "tiny-gpt2-skip"
    written = json.loads(
        Path(to_json(graph, tmp_path / "graph.json", slug="once", tokenizer=model.tokenizer)).read_text()
    )
    assert written["metadata"]["scan"] == "tiny-gpt2-skip"
    assert attribute(model, "Once upon a time", shipped_transcoders(model), batch_size=64).scan is None
