"""Bad input to transcoders: each is refused with the right error type and a message naming the
field (and the value where there is one): configs, tensors, files of both formats, sets, models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from interp_gpt import GPT, Config
from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import Transcoder, TranscoderConfig, check_transcoder_fits, load_transcoders, save_transcoders

D_IN, D_SAE, D_OUT = 12, 40, 10


def meta(layer: int = 0, hook_in: str = "ln2.hook_normalized", **extra: str) -> dict[str, str]:
    return {"hook_name": f"blocks.{layer}.{hook_in}", "hook_name_out": f"blocks.{layer}.hook_mlp_out", **extra}


def cfg(**kw: Any) -> TranscoderConfig:
    fields: dict[str, Any] = dict(d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, metadata=meta())
    fields.update(kw)
    return TranscoderConfig(**fields)


def tc(layer: int = 0, **kw: Any) -> Transcoder:
    kw.setdefault("metadata", meta(layer))
    return Transcoder(cfg(**kw))


# ------------------------------------------------------------------------------------------
# The config: every field's type and value
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields,error,match",
    [
        (dict(architecture="topk"), ValueError, r"^k: a topk transcoder needs k"),
        (dict(architecture="relu", k=5), ValueError, r"k=5: only a topk transcoder"),
        (dict(architecture="topk", k=41), ValueError, r"k=41: expected an integer in 1..d_sae=40"),
        (dict(architecture="topk", k=2.0), TypeError, r"k=2.0: expected a positive integer"),
        (dict(d_in="12"), TypeError, r"d_in='12': expected a positive integer, got str"),
        (dict(d_sae=0), ValueError, r"d_sae=0: expected a positive integer"),
        (dict(d_out=True), TypeError, r"d_out=True: expected a positive integer"),
        (dict(skip="false"), TypeError, r"skip='false': expected a boolean"),
        (dict(nonnegative_acts=1), TypeError, r"nonnegative_acts=1: expected a boolean"),
        (dict(architecture="relu", nonnegative_acts=False), ValueError, r"nonnegative_acts=False: a relu"),
        (dict(architecture="gated"), ValueError, r"architecture='gated' is not a transcoder architecture"),
        (dict(architecture="skip_transcoder"), ValueError, r"sae-lens' file name for architecture='relu', skip=True"),
        (dict(architecture=None), TypeError, r"architecture=None: expected a string"),
        (dict(normalize_activations="layer_norm"), ValueError, r"normalize_activations='layer_norm' is not supported"),
        (dict(dtype="int8"), ValueError, r"dtype='int8' is not a float dtype"),
        (dict(metadata="blocks.0"), TypeError, r"metadata: expected a dict"),
        (dict(metadata={"hook_name": 3}), TypeError, r"metadata.hook_name=3: expected a string"),
        (dict(metadata={"model_name": ["gpt2"]}), TypeError, r"metadata.model_name=\['gpt2'\]: expected a string"),
        (
            dict(metadata={"hook_name": "blocks.0.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out"}),
            ValueError,
            r"metadata.hook_name_out='blocks.1.hook_mlp_out' is in layer 1 but metadata.hook_name=.* layer 0",
        ),
    ],
)
def test_a_bad_config_is_refused_by_field(fields: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        cfg(**fields)


def test_transcoder_takes_only_a_config() -> None:
    with pytest.raises(TypeError, match=r"cfg: expected a TranscoderConfig .* got int"):
        Transcoder(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^k: a topk transcoder needs k"):
        Transcoder(dict(d_in=4, d_sae=8, d_out=4, architecture="topk"))


# ------------------------------------------------------------------------------------------
# Tensors in
# ------------------------------------------------------------------------------------------
def test_an_input_of_another_width_is_refused_naming_d_in_and_the_shape() -> None:
    t = tc(skip=True)
    for call in (t.encode, t.forward):
        with pytest.raises(ValueError, match=r"x has shape \(2, 3, 128\); expected \[\.\.\., d_in=12\]"):
            call(torch.zeros(2, 3, 128))
    with pytest.raises(ValueError, match=r"x has shape \(\); expected"):
        t.encode(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"x: expected a tensor \[\.\.\., d_in=12\], got list"):
        t.encode([[0.0] * 12])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"x: expected a float tensor, got dtype torch.int64"):
        t.encode(torch.zeros(2, 12, dtype=torch.long))


def test_decode_checks_its_features_and_the_skip_input() -> None:
    t = tc(skip=True)
    acts = torch.zeros(2, D_SAE)
    with pytest.raises(ValueError, match=r"feature_acts has shape \(2, 12\); expected \[\.\.\., d_sae=40\]"):
        t.decode(torch.zeros(2, D_IN), torch.zeros(2, D_IN))
    with pytest.raises(ValueError, match=r"x: a skip transcoder adds x @ W_skip.T; pass its input"):
        t.decode(acts)
    with pytest.raises(ValueError, match=r"x has shape \(3, 12\) but feature_acts \(2, 40\)"):
        t.decode(acts, torch.zeros(3, D_IN))
    with pytest.raises(TypeError, match=r"feature_acts: expected a tensor, got ndarray"):
        t.decode(acts.numpy())  # type: ignore[arg-type]
    assert tc(skip=False).decode(acts).shape == (2, D_OUT)  # no skip: x is not needed


def test_init_weights_seed_must_be_an_integer() -> None:
    with pytest.raises(TypeError, match=r"seed='1': expected an integer"):
        tc().init_weights(seed="1")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# sae-lens folders
# ------------------------------------------------------------------------------------------
def saved(tmp_path: Path, **kw: Any) -> Path:
    folder = tmp_path / "tc"
    tc(**kw).save_model(folder)
    return folder


def edit_cfg(folder: Path, **changes: Any) -> None:
    d = json.loads((folder / "cfg.json").read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    (folder / "cfg.json").write_text(json.dumps(d))
    w = load_file(folder / "sae_weights.safetensors")
    save_file(w, str(folder / "sae_weights.safetensors"))  # without the digest: the edit is on purpose


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(apply_b_dec_to_input="false"), r"apply_b_dec_to_input='false': a transcoder's b_dec .* expected false"),
        (dict(apply_b_dec_to_input=True), r"apply_b_dec_to_input=True"),
        (dict(d_out=None), r"missing field 'd_out'"),
        (dict(d_out="10"), r"d_out='10': expected a positive integer"),
        (dict(architecture="standard"), r"architecture='standard' is not a transcoder"),
        (dict(architecture="topk_transcoder"), r"k: a topk transcoder needs k"),
        (dict(reshape_activations="hook_z"), r"reshape_activations='hook_z'"),
        (dict(metadata={"hook_name": 1, "sae_lens_version": "6.0.0"}), r"metadata.hook_name=1: expected a string"),
    ],
)
def test_a_bad_sae_lens_cfg_is_refused_naming_file_and_field(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    folder = saved(tmp_path)
    edit_cfg(folder, **changes)
    with pytest.raises(CheckpointError, match=re.escape(str(folder / "cfg.json")) + ".*" + match):
        load_transcoders(folder)


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda w: w.update(W_dec=w["W_dec"].T.contiguous()), r"mis-shaped W_dec \(10, 40\) \(expected \(40, 10\)\)"),
        (lambda w: w.pop("W_skip"), r"missing \['W_skip'\]"),
        (lambda w: w.update(threshold=torch.zeros(D_SAE)), r"unexpected \['threshold'\]"),
        (lambda w: w["b_enc"].__setitem__(3, float("nan")), r"tensor 'b_enc' holds non-finite"),
        (
            lambda w: w.update(b_dec=torch.zeros(D_OUT, dtype=torch.long)),
            r"tensor 'b_dec' holds non-finite \(or non-float\)",
        ),
    ],
)
def test_bad_tensors_are_refused_naming_the_file_and_tensor(tmp_path: Path, edit: Any, match: str) -> None:
    folder = saved(tmp_path, skip=True)
    w = load_file(folder / "sae_weights.safetensors")
    edit(w)
    save_file(w, str(folder / "sae_weights.safetensors"))
    with pytest.raises(CheckpointError, match=re.escape(str(folder / "sae_weights.safetensors")) + ".*" + match):
        load_transcoders(folder)


def test_a_cfg_from_another_save_and_broken_files_are_refused(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    d = json.loads((folder / "cfg.json").read_text())
    d["metadata"]["model_name"] = "gpt2-medium"
    (folder / "cfg.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=r"was saved with another cfg.json"):
        load_transcoders(folder)
    (folder / "cfg.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"cfg.json: not valid JSON"):
        load_transcoders(folder)
    (folder / "sae_weights.safetensors").write_bytes(b"nonsense")
    (folder / "cfg.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=r"sae_weights.safetensors: not a readable safetensors file"):
        load_transcoders(folder)


# ------------------------------------------------------------------------------------------
# circuit-tracer sets
# ------------------------------------------------------------------------------------------
def ct_set(tmp_path: Path, config: str, layers: tuple[int, ...] = (0, 1), **tensors: torch.Tensor) -> Path:
    for i in layers:
        w = {
            "W_enc": torch.randn(D_SAE, D_IN),
            "W_dec": torch.randn(D_SAE, D_OUT),
            "b_enc": torch.zeros(D_SAE),
            "b_dec": torch.zeros(D_OUT),
            **tensors,
        }
        save_file(w, str(tmp_path / f"layer_{i}.safetensors"))
    (tmp_path / "config.yaml").write_text(config)
    return tmp_path / "config.yaml"


HOOKS_YAML = "feature_input_hook: ln2.hook_normalized\nfeature_output_hook: hook_mlp_out\n"


@pytest.mark.parametrize(
    "config,tensors,error,match",
    [
        (HOOKS_YAML + "activation: gelu\n", {}, CheckpointError, r"activation='gelu': expected one of relu"),
        (HOOKS_YAML + "activation: topk\n", {}, CheckpointError, r"layer_0.safetensors: k: a topk transcoder needs k"),
        (
            HOOKS_YAML + "activation: topk\nk: 3\n",
            {"k": torch.tensor(4)},
            CheckpointError,
            r"stores k=4 but its config says k=3",
        ),
        (HOOKS_YAML + "activation: topk\nk: 0\n", {}, CheckpointError, r"k=0: expected a positive integer"),
        (
            HOOKS_YAML + "activation: relu\nactivation_function: topk\n",
            {},
            CheckpointError,
            r"activation='relu' but activation_function='topk'",
        ),
        (
            HOOKS_YAML + "activation: relu\n",
            {"activation_function.threshold": torch.zeros(D_SAE)},
            CheckpointError,
            r"unexpected \['threshold'\]",
        ),
        (
            HOOKS_YAML + "model_kind: cross_layer_transcoder\n",
            {},
            CheckpointError,
            r"model_kind=.cross_layer_transcoder.: load_transcoders reads per-layer sets .* load_clt",
        ),
        ("feature_output_hook: hook_mlp_out\n", {}, CheckpointError, r"feature_input_hook=None: expected a hook name"),
        (
            "feature_input_hook: blocks.0.hook_resid_mid\nfeature_output_hook: hook_mlp_out\n",
            {},
            CheckpointError,
            r"feature_input_hook='blocks.0.hook_resid_mid': expected a name relative",
        ),
        (HOOKS_YAML + "model_name: 3\n", {}, CheckpointError, r"model_name=3: expected a string"),
        ("- a list\n", {}, CheckpointError, r"config.yaml: expected a YAML mapping, got list"),
        ("a: [unclosed\n", {}, CheckpointError, r"config.yaml: not valid YAML"),
        (
            HOOKS_YAML + "transcoders: [hf://mntss/x/layer_0.safetensors]\n",
            {},
            CheckpointError,
            r"transcoders\[0\]='hf://mntss/x/layer_0.safetensors' is on the Hugging Face hub",
        ),
        (
            HOOKS_YAML
            + "transcoders: [{layer: 0, filepath: layer_0.safetensors}, {layer: 0, filepath: layer_1.safetensors}]\n",
            {},
            CheckpointError,
            r"layer 0 is given twice",
        ),
        (
            HOOKS_YAML + "transcoders: [{layer: -1, filepath: layer_0.safetensors}]\n",
            {},
            CheckpointError,
            r"transcoders\[0\].layer=-1",
        ),
        (
            HOOKS_YAML + "transcoders: [nowhere.safetensors]\n",
            {},
            FileNotFoundError,
            r"layer 0's file .*nowhere.safetensors' does not exist",
        ),
        (HOOKS_YAML + "transcoders: []\n", {}, CheckpointError, r"transcoders=\[\]: expected a list"),
        (
            HOOKS_YAML,
            {"W_enc": torch.zeros(D_SAE * D_IN)},
            CheckpointError,
            r"W_enc has shape \(480,\); expected \[d_sae, d_in\]",
        ),
        (
            HOOKS_YAML,
            {"W_dec": torch.zeros(D_OUT, D_SAE)},
            CheckpointError,
            r"mis-shaped W_dec \(10, 40\) \(expected \(40, 10\)\)",
        ),
        (
            HOOKS_YAML,
            {"W_skip": torch.zeros(D_IN, D_IN)},
            CheckpointError,
            r"mis-shaped W_skip \(12, 12\) \(expected \(10, 12\)\)",
        ),
    ],
)
def test_a_bad_circuit_tracer_set_is_refused_by_name(
    tmp_path: Path, config: str, tensors: dict[str, torch.Tensor], error: type, match: str
) -> None:
    path = ct_set(tmp_path, config, **tensors)
    with pytest.raises(error, match=match):
        load_transcoders(path)


def test_a_circuit_tracer_tensor_missing_is_named(tmp_path: Path) -> None:
    path = ct_set(tmp_path, HOOKS_YAML)
    w = load_file(tmp_path / "layer_1.safetensors")
    del w["b_enc"]
    save_file(w, str(tmp_path / "layer_1.safetensors"))
    with pytest.raises(CheckpointError, match=r"layer_1.safetensors: missing tensor 'b_enc'"):
        load_transcoders(path)
    w = load_file(tmp_path / "layer_0.safetensors")
    w["W_dec"][0, 0] = float("inf")
    save_file(w, str(tmp_path / "layer_0.safetensors"))
    with pytest.raises(CheckpointError, match=r"layer_0.safetensors: tensor 'W_dec' holds non-finite"):
        load_transcoders(path)


# ------------------------------------------------------------------------------------------
# load_transcoders: paths, sets, models
# ------------------------------------------------------------------------------------------
def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"load_transcoders: path: expected a folder, a config file or a list"):
        load_transcoders(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"path=\[\]"):
        load_transcoders([])
    with pytest.raises(FileNotFoundError, match=r"path=.*nowhere.*: no such file or folder"):
        load_transcoders(tmp_path / "nowhere")
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(FileNotFoundError, match=r"holds no cfg.json .* \(it holds: x.txt\)"):
        load_transcoders(tmp_path)
    save_file({"W_enc": torch.zeros(2, 2)}, str(tmp_path / "layer_0.safetensors"))
    with pytest.raises(ValueError, match=r"layer_0.safetensors'.*a layer's .safetensors alone does not say its hooks"):
        load_transcoders(tmp_path / "layer_0.safetensors")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cfg.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"needs cfg.json and sae_weights.safetensors; missing sae_weights"):
        load_transcoders(tmp_path / "a")


def test_a_layer_given_twice_is_refused(tmp_path: Path) -> None:
    tc(1).save_model(tmp_path / "a")
    tc(1).save_model(tmp_path / "b")
    with pytest.raises(ValueError, match=r"load_transcoders: layer 1 is given twice"):
        load_transcoders([tmp_path / "a", tmp_path / "b"])


def test_a_transcoder_that_does_not_fit_the_model_is_refused(tmp_path: Path) -> None:
    model = GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32, model_name="gpt2"))
    Transcoder(TranscoderConfig(d_in=64, d_sae=8, d_out=64, metadata=meta(0, model_name="gpt2-medium"))).save_model(
        tmp_path / "other"
    )
    with pytest.raises(
        ValueError, match=r"layer 0 is for 'gpt2-medium' \(its cfg.metadata.model_name\) but the model is 'gpt2'"
    ):
        load_transcoders(tmp_path / "other", model)
    Transcoder(TranscoderConfig(d_in=D_IN, d_sae=8, d_out=64, metadata=meta(1))).save_model(tmp_path / "narrow")
    with pytest.raises(ValueError, match=r"d_in=12 does not fit 'blocks.1.ln2.hook_normalized', which is d_model=64"):
        load_transcoders(tmp_path / "narrow", model)
    Transcoder(TranscoderConfig(d_in=64, d_sae=8, d_out=64, metadata=meta(5))).save_model(tmp_path / "deep")
    with pytest.raises(ValueError, match=r"layer 5 does not exist: the model's layers are 0..1"):
        load_transcoders(tmp_path / "deep", model)
    Transcoder(
        TranscoderConfig(d_in=64, d_sae=8, d_out=64, metadata=meta(1, hook_in="ln2.hook_normalised"))
    ).save_model(tmp_path / "typo")
    with pytest.raises(
        KeyError,
        match=r"cfg.metadata.hook_name: no hook point named 'blocks.1.ln2.hook_normalised'; did you mean 'blocks.1.ln2.hook_normalized'",
    ):
        load_transcoders(tmp_path / "typo", model)
    with pytest.raises(ValueError, match=r"dtype='int' is not a float dtype"):
        load_transcoders(tmp_path / "deep", dtype="int")


# ------------------------------------------------------------------------------------------
# save_transcoders
# ------------------------------------------------------------------------------------------
def test_save_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"format='hf'; expected one of 'saelens', 'circuit-tracer'"):
        save_transcoders([tc()], tmp_path / "s", format="hf")
    with pytest.raises(TypeError, match=r"tcs\[1\]: expected a Transcoder, got str"):
        save_transcoders([tc(), "x"], tmp_path / "s")  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"tcs: expected a Transcoder or a non-empty list"):
        save_transcoders([], tmp_path / "s")
    with pytest.raises(ValueError, match=r"layers \[0\] are given twice"):
        save_transcoders([tc(0), tc(0)], tmp_path / "s")
    with pytest.raises(ValueError, match=r"tcs\[0\].cfg.metadata.hook_name=None names no layer"):
        save_transcoders([tc(metadata={})], tmp_path / "s")
    with pytest.raises(TypeError, match=r"path: expected a folder path, got int"):
        save_transcoders([tc()], 3)  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match=r"'.*file' is a file; expected a folder"):
        save_transcoders([tc()], tmp_path / "file")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"holds other files \(notes.txt\)"):
        save_transcoders([tc()], tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "mine"]


def test_circuit_tracer_refuses_sets_it_cannot_hold_exactly(tmp_path: Path) -> None:
    ct = dict(format="circuit-tracer")
    with pytest.raises(ValueError, match=r"holds the layers 0..n-1.*got layers \[1\] \(missing \[0\]\)"):
        save_transcoders([tc(1)], tmp_path / "s", **ct)
    with pytest.raises(ValueError, match=r"layer 1: architecture='jumprelu' but layer 0's is 'relu'"):
        save_transcoders([tc(0), tc(1, architecture="jumprelu", nonnegative_acts=False)], tmp_path / "s", **ct)
    with pytest.raises(ValueError, match=r"layer 0: nonnegative_acts=True: circuit-tracer's TopK keeps negative"):
        save_transcoders([tc(0, architecture="topk", k=3)], tmp_path / "s", **ct)
    with pytest.raises(ValueError, match=r"layer 1: feature_input_hook 'hook_resid_mid' differs"):
        save_transcoders([tc(0), tc(1, metadata=meta(1, "hook_resid_mid"))], tmp_path / "s", **ct)
    neg = tc(0, architecture="jumprelu")
    with torch.no_grad():
        neg.threshold.fill_(-0.5)
    with pytest.raises(
        ValueError, match=r"nonnegative_acts=True with negative thresholds has no exact form in circuit"
    ):
        save_transcoders([neg], tmp_path / "s", **ct)
    keep = tc(0, architecture="jumprelu", nonnegative_acts=False)
    with torch.no_grad():
        keep.threshold.fill_(-0.5)
    with pytest.raises(
        ValueError, match=r"nonnegative_acts=False with negative thresholds .* no exact form in sae-lens"
    ):
        save_transcoders([keep], tmp_path / "s")
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------
# metadata.model_processing: the weights a transcoder is for (raw / processed)
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value,error,match",
    [
        ("folded", ValueError, r"metadata.model_processing='folded': expected 'raw', 'processed' or a dict"),
        (1, TypeError, r"metadata.model_processing=1: expected 'raw', 'processed' or a dict, got int"),
        ({"fold_ln": True}, ValueError, r"missing 'center_writing_weights'; give both"),
        (
            {"fold_lm": True, "center_writing_weights": True},
            ValueError,
            r"unknown key 'fold_lm'; did you mean 'fold_ln'\?",
        ),
        (
            {"fold_ln": "false", "center_writing_weights": False},
            TypeError,
            r"metadata.model_processing.fold_ln='false': expected a boolean",
        ),
    ],
)
def test_a_bad_model_processing_is_refused_naming_the_key(value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        cfg(metadata={**meta(), "model_processing": value})


def test_a_bad_model_processing_in_either_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "ct").mkdir()
    path = ct_set(tmp_path / "ct", HOOKS_YAML + "model_processing: processd\n")
    with pytest.raises(CheckpointError, match=r"config.yaml: model_processing='processd': expected 'raw', 'processed'"):
        load_transcoders(path)
    tc(0).save_model(tmp_path / "sl")
    raw = json.loads((tmp_path / "sl" / "cfg.json").read_text())
    raw["metadata"]["model_processing"] = {"fold_ln": 1, "center_writing_weights": False}
    (tmp_path / "sl" / "cfg.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"cfg.json: metadata.model_processing.fold_ln=1: expected a boolean"):
        load_transcoders(tmp_path / "sl")


def test_a_transcoder_with_no_exact_conversion_is_refused_by_name() -> None:
    """Processed weights (hook_mlp_out centred) for a transcoder made for raw ones is converted; the
    other way round, or a raw hook_resid_mid reader on a centred stream, is refused naming the hook."""
    model = GPT(Config(n_layers=1, d_model=D_IN, n_heads=2, d_vocab=20, n_ctx=8))
    model.process_weights_()
    t = tc(0, d_out=D_IN, metadata={**meta(0, "hook_resid_mid"), "model_processing": "raw"})
    with pytest.raises(ValueError, match=r"check_transcoder_fits: the transcoder of layer 0: blocks.0.hook_resid_mid"):
        check_transcoder_fits(model, t)
    raw = GPT(Config(n_layers=1, d_model=D_IN, n_heads=2, d_vocab=20, n_ctx=8))
    t = tc(0, d_out=D_IN, metadata={**meta(0), "model_processing": "processed"})
    with pytest.raises(ValueError, match=r"blocks.0.hook_mlp_out: the transcoder was made for centred writing weights"):
        check_transcoder_fits(raw, t)
    with pytest.raises(ValueError, match=r"layer 0: blocks.0.hook_mlp_out"):
        with raw.transcoders([t]):
            pass
