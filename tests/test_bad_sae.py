"""SAEs on bad input: each case names the field or argument (and the value) and raises the right type.

The config file (`cfg.json`): every field's JSON type is checked, a wrong one refused as CheckpointError
naming the field. An SAE on a model it does not fit (width, hook, another model's name), at a hook with no
direct logit effect, or a per-head SAE without its head: refused (or warned) by name, in the API and in
`interp-gpt features` (one line on stderr, status 2).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.cli import main
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.features import feature_figures, feature_logits, feature_page, feature_report, format_feature
from interp_gpt.sae.saes.io import CFG_FILENAME

TINY = dict(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32)


def _sae(d_in: int, hook: str, d_sae: int = 16, seed: int = 0, **kw: Any) -> SAE:
    meta = kw.pop("metadata", {})
    s = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, metadata={"hook_name": hook, **meta}, **kw))
    s.init_weights(seed=seed)
    return s


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(Config(**TINY)).eval()


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, 100, (3, 10), generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------
# Item 8: the config's field types (booleans above all), through the loader and directly
# ----------------------------------------------------------------------------
# (field, value, what the message must say); "metadata.x" puts x under metadata.
BAD_FIELDS = [
    ("apply_b_dec_to_input", "false", r"apply_b_dec_to_input='false': expected a boolean \(JSON true or false\)"),
    ("apply_b_dec_to_input", 0.5, r"apply_b_dec_to_input=0\.5: expected a boolean"),
    ("apply_b_dec_to_input", 1, r"apply_b_dec_to_input=1: expected a boolean"),
    ("apply_b_dec_to_input", None, r"apply_b_dec_to_input=null: expected a boolean"),
    ("rescale_acts_by_decoder_norm", "true", r"rescale_acts_by_decoder_norm='true': expected a boolean"),
    ("d_in", 16.0, r"d_in=16\.0: expected a positive integer, got float"),
    ("d_in", True, r"d_in=True: expected a positive integer, got bool"),
    ("d_sae", "48", r"d_sae='48': expected a positive integer, got str"),
    ("k", 8.0, r"k=8\.0: expected a positive integer, got float"),
    ("architecture", 1, r"architecture=1: expected a string, got int"),
    ("normalize_activations", ["none"], r"normalize_activations=\['none'\]: expected a string, got list"),
    ("reshape_activations", False, r"reshape_activations=False: expected a string, got bool"),
    ("device", 0, r"device=0: expected a string, got int"),
    ("dtype", 32, r"dtype=32 is not a float dtype"),
    ("metadata", [1], r"metadata must be an object, got list"),
    ("metadata.hook_name", 5, r"metadata\.hook_name=5: expected a string, got int"),
    ("metadata.model_name", ["gpt2"], r"metadata\.model_name=\['gpt2'\]: expected a string, got list"),
    ("metadata.hook_head_index", "0", r"metadata\.hook_head_index='0': expected an integer, got str"),
    ("metadata.hook_head_index", True, r"metadata\.hook_head_index=True: expected an integer, got bool"),
]


@pytest.mark.parametrize(("key", "value", "words"), BAD_FIELDS, ids=[f"{k}={v!r}" for k, v, _ in BAD_FIELDS])
def test_a_cfg_json_field_of_the_wrong_type_is_refused_by_name(
    tmp_path: Path, key: str, value: Any, words: str
) -> None:
    _sae(16, "blocks.0.hook_resid_pre", d_sae=48, architecture="topk", k=8).save_model(tmp_path)
    cfg = json.loads((tmp_path / CFG_FILENAME).read_text())
    if key.startswith("metadata."):
        cfg["metadata"][key.removeprefix("metadata.")] = value
    elif key == "metadata":
        cfg["metadata"] = value
        cfg["sae_lens_version"] = "6.0.0"  # still a 6.x file, so metadata is read as such
    else:
        cfg[key] = value
    (tmp_path / CFG_FILENAME).write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=words) as e:
        SAE.from_pretrained(tmp_path)
    assert str(tmp_path / CFG_FILENAME) in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"apply_b_dec_to_input": "false"}, TypeError, r"apply_b_dec_to_input='false': expected a boolean"),
        ({"apply_b_dec_to_input": 0.5}, TypeError, r"apply_b_dec_to_input=0\.5: expected a boolean"),
        ({"rescale_acts_by_decoder_norm": None}, TypeError, r"rescale_acts_by_decoder_norm=None: expected a boolean"),
        ({"d_in": 4.0}, TypeError, r"d_in=4\.0: expected a positive integer"),
        ({"d_sae": -3}, ValueError, r"d_sae=-3: expected a positive integer"),
        ({"device": 1}, TypeError, r"device=1: expected a string"),
        ({"metadata": {"hook_name": 3}}, TypeError, r"metadata\.hook_name=3: expected a string"),
        ({"metadata": "blocks.0.hook_resid_pre"}, TypeError, r"metadata: expected a dict"),
    ],
)
def test_sae_config_fields_of_the_wrong_type(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        SAEConfig(**{"d_in": 4, "d_sae": 8, **kwargs})


def test_json_booleans_and_a_torch_device_are_accepted() -> None:
    cfg = SAEConfig(d_in=4, d_sae=8, apply_b_dec_to_input=False, device=torch.device("cpu"))
    assert cfg.apply_b_dec_to_input is False and cfg.device == "cpu"


# ----------------------------------------------------------------------------
# Item 7: an SAE that does not fit the model (width, hook, the model it was trained on)
# ----------------------------------------------------------------------------
def test_feature_report_refuses_a_width_mismatch_by_name(model: GPT, tokens: torch.Tensor) -> None:
    sae = _sae(32, "blocks.1.hook_resid_pre")
    with pytest.raises(ValueError, match=r"sae\.cfg\.d_in=32 does not fit 'blocks\.1\.hook_resid_pre', whose act"):
        feature_report(model, sae, tokens, 0)
    with pytest.raises(ValueError, match=r"sae\.cfg\.d_in=32 does not fit 'blocks\.1\.hook_resid_pre'"):
        feature_logits(model, sae, 0)


def test_feature_report_refuses_a_hook_the_model_lacks_with_close_names(model: GPT, tokens: torch.Tensor) -> None:
    with pytest.raises(KeyError, match=r"hook_name: no hook point named 'blocks\.1\.hook_resid_pr'; did you mean"):
        feature_report(model, _sae(64, "blocks.1.hook_resid_pr"), tokens, 0)
    with pytest.raises(KeyError, match=r"layer 7 is out of range, layers are 0\.\.1"):
        feature_logits(model, _sae(64, "blocks.7.hook_resid_pre"), 0)
    with pytest.raises(ValueError, match=r"sae\.cfg\.metadata\.hook_name is not set"):
        feature_report(model, SAE(SAEConfig(d_in=64, d_sae=8)), tokens, 0)
    with pytest.raises(TypeError, match=r"sae: expected an interp_gpt\.sae\.SAE, got dict"):
        feature_report(model, {"d_in": 64}, tokens, 0)  # type: ignore[arg-type]


def test_an_sae_trained_on_another_model_is_refused_by_name(tokens: torch.Tensor) -> None:
    torch.manual_seed(0)
    gpt2 = GPT(Config(**TINY, model_name="gpt2")).eval()
    other = _sae(64, "blocks.1.hook_resid_pre", metadata={"model_name": "pythia-70m"})
    with pytest.raises(
        ValueError, match=r"the SAE is for 'pythia-70m' \(its cfg\.metadata\.model_name\) but the model is 'gpt2'"
    ):
        feature_report(gpt2, other, tokens, 0)
    with pytest.raises(ValueError, match=r"is for 'pythia-70m'.*SAE\.from_pretrained\(\.\.\., model_name='gpt2'\)"):
        gpt2.add_sae(other)
    assert gpt2.acts_to_saes == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same model under another spelling: neither refused nor warned
        for name in ("gpt2", "gpt2-small", "openai-community/gpt2", "GPT2"):
            feature_logits(gpt2, _sae(64, "blocks.1.hook_resid_pre", metadata={"model_name": name}), 0)
        feature_logits(gpt2, _sae(64, "blocks.1.hook_resid_pre"), 0)  # no model_name recorded


# ----------------------------------------------------------------------------
# Item 6: hooks with no direct logit effect, per-head SAEs without their head
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("hook", "d_in", "words"),
    [
        ("blocks.0.attn.hook_q", 16, "queries, keys and values reach the residual stream only through the attention"),
        ("blocks.1.attn.hook_v", 16, "queries, keys and values"),
        (
            "blocks.0.mlp.hook_pre",
            256,
            "the MLP's pre-activations reach the residual stream only through its nonlinearity",
        ),
        ("blocks.0.ln1.hook_scale", 1, "that activation is not written into the residual stream by a linear map"),
    ],
)
def test_feature_logits_refuses_a_hook_without_a_direct_logit_effect(
    model: GPT, tokens: torch.Tensor, hook: str, d_in: int, words: str
) -> None:
    meta = {"hook_head_index": 0} if "attn" in hook else {}
    sae = _sae(d_in, hook, metadata=meta)
    with pytest.raises(ValueError, match=rf"feature_logits: sae reads '{hook}': {words}"):
        feature_logits(model, sae, 1)
    report = feature_report(model, sae, tokens, 1)  # the contexts still; no logit lists, and why
    assert report.promoted == [] and report.suppressed == [] and words in report.extra["no_logits"]
    assert "no promoted / suppressed tokens: sae reads" in format_feature(report)
    assert "no direct logit effect" in feature_figures(report)["logits"].layout.title.text


def test_a_per_head_sae_needs_its_head(model: GPT, tokens: torch.Tensor) -> None:
    sae = _sae(16, "blocks.0.attn.hook_z")  # d_in = d_head, no reshape: one head at a time
    with pytest.raises(
        ValueError, match=r"set sae\.cfg\.metadata\.hook_head_index to the head it was trained on \(0\.\.3\)"
    ):
        feature_logits(model, sae, 0)
    with pytest.raises(ValueError, match=r"feature_report: sae reads 'blocks\.0\.attn\.hook_z' one head at a time"):
        feature_report(model, sae, tokens, 0)
    sae.cfg.metadata["hook_head_index"] = 4
    with pytest.raises(ValueError, match=r"sae\.cfg\.metadata\.hook_head_index=4 is out of range: heads are 0\.\.3"):
        feature_logits(model, sae, 0)


# ----------------------------------------------------------------------------
# Item 18: `interp-gpt features` with an SAE that does not fit: one line, status 2
# ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "t.txt"
    path.write_text("The king and the queen walked out, and the king spoke. " * 20, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("hook", "d_in", "words"),
    [
        ("blocks.5.hook_resid_pre", 128, r"no hook point named 'blocks.5.hook_resid_pre': layer 5 is out of range"),
        ("blocks.1.hook_resid_pr", 128, "did you mean 'blocks.1.hook_resid_pre'"),
        (
            "blocks.1.hook_resid_pre",
            64,
            "sae.cfg.d_in=64 does not fit 'blocks.1.hook_resid_pre', whose activations are 128",
        ),
    ],
)
def test_features_command_with_an_sae_that_does_not_fit_is_one_line_and_status_2(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str], hook: str, d_in: int, words: str
) -> None:
    _sae(d_in, hook).save_model(tmp_path / "sae")
    rc = main(["features", "tiny-gpt2", str(tmp_path / "sae"), "--feature", "1", "--data", str(corpus)])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(f"error: SAE {tmp_path / 'sae'}: ") and words in err
    assert "Traceback" not in err and out == ""


def test_features_command_refuses_another_models_sae_in_one_line(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _sae(128, "blocks.1.hook_resid_pre", d_sae=32, metadata={"model_name": "gpt2-medium"}).save_model(tmp_path / "s")
    rc = main(["features", "tiny-gpt2", str(tmp_path / "s"), "--feature", "1", "--data", str(corpus),
               "--max-windows", "2"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.count("\n") == 1 and "the SAE is for 'gpt2-medium'" in err and "'tiny-gpt2'" in err
    assert "Traceback" not in err and out == ""


# ----------------------------------------------------------------------------
# Item 19: token text in the feature page's plotly labels is escaped like every other figure's
# ----------------------------------------------------------------------------
def test_logit_bar_labels_escape_token_markup(tmp_path: Path) -> None:
    from interp_gpt.sae.features import FeatureReport

    report = FeatureReport(
        feature=3,
        hook_name="blocks.0.hook_resid_pre",
        contexts=[],
        activations=torch.tensor([1.0, 2.0]),
        n_tokens=10,
        promoted=[("<b>x</b>", 2.0), (" $a$", 1.0)],
        suppressed=[("<br>", -1.0), ("&amp;", -2.0)],
    )
    bars = feature_figures(report)["logits"]
    ticks, coords = list(bars.layout.yaxis.ticktext), list(bars.data[0].y)
    assert "&lt;b&gt;x&lt;/b&gt;" in ticks and "&lt;br&gt;" in ticks and "&amp;amp;" in ticks
    assert "␣&#36;a&#36;" in ticks  # no TeX either
    for label in ticks + coords:
        assert "<" not in label and ">" not in label and "$" not in label, label
    page = feature_page(report, tmp_path / "f.html").read_text(encoding="utf-8")
    assert "<b>x</b>" not in page and "\\u003cb\\u003ex" not in page
