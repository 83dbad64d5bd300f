"""The SAE module: equal to sae-lens 6.x, its on-disk format both ways, the HF cache, bad files.

The comparisons need sae-lens, which pins transformer-lens < 4: CI installs it in its
transformer-lens 3.9 venv (.venv-tl3); elsewhere they skip and say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.io import CFG_FILENAME, WEIGHTS_FILENAME

try:
    import sae_lens
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

HOOK = "blocks.1.hook_resid_pre"
# One of each architecture sae-lens ships for inference, and the options that change its numerics.
VARIANTS = {
    "standard": dict(architecture="standard"),
    "standard_no_b_dec_in": dict(architecture="standard", apply_b_dec_to_input=False),
    "standard_layer_norm": dict(architecture="standard", normalize_activations="layer_norm"),
    "standard_norm_rescale": dict(architecture="standard", normalize_activations="constant_norm_rescale"),
    "topk": dict(architecture="topk", k=6),
    "topk_rescaled": dict(architecture="topk", k=6, rescale_acts_by_decoder_norm=True),
    "jumprelu": dict(architecture="jumprelu"),
}


def random_sae(seed: int = 0, d_in: int = 16, d_sae: int = 48, hook: str = HOOK, **kw: object) -> SAE:
    """An SAE with every parameter random (non-zero biases, thresholds that gate some features)."""
    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, metadata={"hook_name": hook, "model_name": "tiny"}, **kw))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            if name == "threshold":
                p.copy_(torch.rand(p.shape, generator=g) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name.startswith("W") else 0.1))
    return sae


def sae_lens_twin(sae: SAE) -> object:
    """sae-lens' SAE of the same config, holding the same tensors."""
    assert sae_lens is not None
    twin = sae_lens.SAE.from_dict(sae.cfg.to_dict())
    twin.load_state_dict(sae.state_dict(), strict=True)
    return twin


# ----------------------------------------------------------------------------
# Numerics: equal to sae-lens
# ----------------------------------------------------------------------------
@needs_sae_lens
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encode_decode_forward_equal_sae_lens(variant: str) -> None:
    sae = random_sae(1, **VARIANTS[variant])  # type: ignore[arg-type]
    twin = sae_lens_twin(sae)
    assert type(twin).__name__.lower().startswith(sae.cfg.architecture.replace("topk", "topk"))
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        feats, ref_feats = sae.encode(x), twin.encode(x)  # type: ignore[attr-defined]
        torch.testing.assert_close(feats, ref_feats, atol=1e-5, rtol=1e-5)
        assert 0 < (feats > 0).float().mean() < 1  # some features on, some off: the activation is exercised
        torch.testing.assert_close(sae.decode(feats), twin.decode(ref_feats), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]
        torch.testing.assert_close(sae(x), twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]
    if sae.cfg.architecture == "topk":
        assert int((feats > 0).sum(-1).max()) <= 6


@needs_sae_lens
def test_hook_z_reshape_equals_sae_lens() -> None:
    sae = random_sae(3, d_in=16, hook="blocks.0.attn.hook_z", reshape_activations="hook_z")
    twin = sae_lens_twin(sae)
    x = torch.randn(2, 3, 4, 4)  # [batch, pos, n_heads, d_head], n_heads * d_head = d_in
    with torch.no_grad():
        out = sae(x)
        assert out.shape == x.shape
        torch.testing.assert_close(out, twin(x), atol=1e-5, rtol=1e-5)  # type: ignore[operator]


def test_encode_follows_the_formulas() -> None:
    """Independent of sae-lens: the three activations, written out."""
    x = torch.randn(4, 16)
    for arch in ("standard", "topk", "jumprelu"):
        sae = random_sae(4, architecture=arch, **({"k": 5} if arch == "topk" else {}))  # type: ignore[arg-type]
        pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
        if arch == "standard":
            want = pre.relu()
        elif arch == "jumprelu":
            want = torch.where(pre > sae.threshold, pre, torch.zeros_like(pre)).relu()
        else:
            kth = pre.topk(5, dim=-1).values[:, -1:]
            want = torch.where(pre >= kth, pre, torch.zeros_like(pre)).relu()
        with torch.no_grad():
            torch.testing.assert_close(sae.encode(x), want.detach())
            torch.testing.assert_close(sae.decode(want), (want @ sae.W_dec + sae.b_dec).detach())


def test_parameters_have_sae_lens_names_and_shapes() -> None:
    sae = random_sae(architecture="jumprelu")
    assert {k: tuple(v.shape) for k, v in sae.state_dict().items()} == {
        "W_enc": (16, 48),
        "W_dec": (48, 16),
        "b_enc": (48,),
        "b_dec": (16,),
        "threshold": (48,),
    }
    assert "threshold" not in SAE(SAEConfig(d_in=4, d_sae=8)).state_dict()


# ----------------------------------------------------------------------------
# The on-disk format, both ways
# ----------------------------------------------------------------------------
@needs_sae_lens
@pytest.mark.parametrize("variant", ["standard", "topk_rescaled", "jumprelu"])
def test_saved_by_sae_lens_loads_here_and_back(variant: str, tmp_path: Path) -> None:
    sae = random_sae(5, **VARIANTS[variant])  # type: ignore[arg-type]
    twin = sae_lens_twin(sae)
    twin.save_model(tmp_path / "theirs")  # type: ignore[attr-defined]
    ours = SAE.from_pretrained(tmp_path / "theirs")
    assert ours.cfg.hook_name == HOOK and ours.cfg.architecture == sae.cfg.architecture
    assert ours.cfg.k == sae.cfg.k and ours.cfg.rescale_acts_by_decoder_norm == sae.cfg.rescale_acts_by_decoder_norm
    for k, v in sae.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k

    ours.save_model(tmp_path / "ours")
    back = sae_lens.SAE.load_from_disk(tmp_path / "ours")  # type: ignore[union-attr]
    assert type(back) is type(twin)
    assert back.cfg.metadata.hook_name == HOOK and back.cfg.metadata.model_name == "tiny"
    x = torch.randn(7, 16)
    with torch.no_grad():
        torch.testing.assert_close(back.encode(x), sae.encode(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back(x), sae(x), atol=1e-5, rtol=1e-5)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    sae = random_sae(6, architecture="topk", k=4)
    weights, cfg = sae.save_model(tmp_path / "sae")
    assert (weights.name, cfg.name) == (WEIGHTS_FILENAME, CFG_FILENAME)
    on_disk = json.loads(cfg.read_text())
    assert on_disk["metadata"]["hook_name"] == HOOK and on_disk["k"] == 4 and on_disk["architecture"] == "topk"
    assert int(on_disk["metadata"]["sae_lens_version"].split(".")[0]) >= 6  # sae-lens reads it as its 6.x layout
    back = SAE.from_pretrained(str(tmp_path / "sae"))
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert torch.equal(back(x), sae(x))
    assert sorted(p.name for p in (tmp_path / "sae").iterdir()) == [CFG_FILENAME, WEIGHTS_FILENAME]  # no temporaries
    half = SAE.from_pretrained(tmp_path / "sae", dtype="float64")
    assert half.W_enc.dtype == torch.float64 and half.cfg.dtype == "float64"


def _write_pre_6(folder: Path, cfg: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / CFG_FILENAME).write_text(json.dumps(cfg))
    d_in, d_sae = cfg["d_in"], cfg["d_sae"]
    save_file(
        {"W_enc": torch.randn(d_in, d_sae), "W_dec": torch.randn(d_sae, d_in), "b_enc": torch.zeros(d_sae),
         "b_dec": torch.zeros(d_in), "scaling_factor": torch.ones(d_sae)},
        str(folder / WEIGHTS_FILENAME),
    )  # fmt: skip


def test_pre_6_config_is_read_as_sae_lens_6_reads_it(tmp_path: Path) -> None:
    """Files written before sae-lens 6 keep hook_point / hook_name at the top level, TopK in activation_fn."""
    old = {"d_in": 16, "d_sae": 32, "hook_point": "blocks.0.hook_resid_post", "model_name": "gpt2-small",
           "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 3}, "normalize_activations": False,
           "dtype": "torch.float32", "context_size": 128, "sae_lens_training_version": "3.2.1"}  # fmt: skip
    _write_pre_6(tmp_path / "old", old)
    sae = SAE.from_pretrained(tmp_path / "old")
    assert sae.cfg.hook_name == "blocks.0.hook_resid_post"
    assert (sae.cfg.architecture, sae.cfg.k, sae.cfg.normalize_activations) == ("topk", 3, "none")
    assert sae.cfg.metadata.model_name == "gpt2-small" and sae.cfg.metadata.context_size == 128
    if sae_lens is not None:  # the same reading as sae-lens'
        theirs = sae_lens.SAE.load_from_disk(tmp_path / "old")
        assert theirs.cfg.metadata.hook_name == sae.cfg.hook_name and theirs.cfg.k == 3
        x = torch.randn(2, 16)
        with torch.no_grad():
            torch.testing.assert_close(theirs.encode(x), sae.encode(x))


def _fake_hub_cache(root: Path, repo_id: str, sae_id: str, sae: SAE) -> None:
    """huggingface_hub's cache layout: models--owner--name/{refs/main, snapshots/<commit>/<files>}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    sae.save_model(repo / "snapshots" / commit / sae_id)


def test_release_found_in_the_local_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sae = random_sae(7)
    _fake_hub_cache(tmp_path / "hub", "someone/tiny-saes", HOOK, sae)
    _fake_hub_cache(tmp_path / "hub", "jbloom/GPT2-Small-SAEs-Reformatted", "blocks.8.hook_resid_pre", sae)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    x = torch.randn(2, 16)
    for release, sae_id in [("someone/tiny-saes", HOOK), ("gpt2-small-res-jb", "blocks.8.hook_resid_pre")]:
        loaded = SAE.from_pretrained(release, sae_id)
        with torch.no_grad():
            assert torch.equal(loaded(x), sae(x))
    with pytest.raises(FileNotFoundError) as e:
        SAE.from_pretrained("someone/tiny-saes", "blocks.5.hook_resid_pre")
    msg = str(e.value)
    assert "someone/tiny-saes/blocks.5.hook_resid_pre/cfg.json" in msg and str(tmp_path / "hub") in msg
    with pytest.raises(ValueError, match="known sae-lens release names: gpt2-small-res-jb"):
        SAE.from_pretrained("not-a-release", HOOK)
    with pytest.raises(FileNotFoundError, match="release='./no_such_folder': no such folder"):
        SAE.from_pretrained("./no_such_folder")
    with pytest.raises(ValueError, match="release='bad name/x y' is not a valid Hugging Face repo id"):
        SAE.from_pretrained("bad name/x y", HOOK)


# ----------------------------------------------------------------------------
# Bad input: clear errors naming the file, nothing written half
# ----------------------------------------------------------------------------
def test_bad_configs() -> None:
    with pytest.raises(ValueError, match="architecture='spline' is not supported; expected one of standard, topk"):
        SAEConfig(d_in=4, d_sae=8, architecture="spline")  # (not an sae-lens architecture)
    with pytest.raises(ValueError, match=r"k=9: expected an integer in 1..d_sae=8"):
        SAEConfig(d_in=4, d_sae=8, architecture="topk", k=9)
    with pytest.raises(ValueError, match="d_in=0: expected a positive integer"):
        SAEConfig(d_in=0, d_sae=8)
    with pytest.raises(ValueError, match="dtype='int8' is not a float dtype"):
        SAEConfig(d_in=4, d_sae=8, dtype="int8")
    with pytest.raises(NotImplementedError, match="covariance_whitening"):
        SAE(SAEConfig(d_in=4, d_sae=8, normalize_activations="covariance_whitening"))


def test_corrupt_files_name_the_file(tmp_path: Path) -> None:
    random_sae(8).save_model(tmp_path / "good")
    cases = {
        "not json": lambda f: (f / CFG_FILENAME).write_text("{d_in: 16,"),
        "no d_in": lambda f: (f / CFG_FILENAME).write_text(json.dumps({"d_sae": 48, "metadata": {}})),
        "a list": lambda f: (f / CFG_FILENAME).write_text("[1, 2]"),
        "bad arch": lambda f: (f / CFG_FILENAME).write_text(
            json.dumps({"d_in": 16, "d_sae": 48, "architecture": "nope", "metadata": {"sae_lens_version": "6.1.0"}})
        ),
        "garbage weights": lambda f: (f / WEIGHTS_FILENAME).write_bytes(b"\x00\x01garbage" * 10),
        "truncated weights": lambda f: (f / WEIGHTS_FILENAME).write_bytes((f / WEIGHTS_FILENAME).read_bytes()[:200]),
    }
    expected = {
        "not json": (CFG_FILENAME, "not valid JSON"),
        "no d_in": (CFG_FILENAME, "missing field 'd_in'"),
        "a list": (CFG_FILENAME, "expected a JSON object"),
        "bad arch": (CFG_FILENAME, "architecture='nope'"),
        "garbage weights": (WEIGHTS_FILENAME, "not a readable safetensors file"),
        "truncated weights": (WEIGHTS_FILENAME, "not a readable safetensors file"),
    }
    for case, spoil in cases.items():
        folder = tmp_path / case.replace(" ", "_")
        random_sae(8).save_model(folder)
        spoil(folder)
        with pytest.raises(CheckpointError) as e:
            SAE.from_pretrained(folder)
        file, words = expected[case]
        assert str(folder / file) in str(e.value) and words in str(e.value), (case, str(e.value))


def test_weights_that_do_not_fit_the_config(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "s"
    random_sae(9).save_model(folder)
    state = {k: v.clone() for k, v in random_sae(9).state_dict().items()}
    bad = dict(state, W_enc=torch.zeros(16, 47), extra=torch.zeros(2))
    del bad["b_enc"]
    save_file(bad, str(folder / WEIGHTS_FILENAME))
    with pytest.raises(
        CheckpointError, match=r"missing \['b_enc'\]; unexpected \['extra'\]; mis-shaped W_enc \(16, 47\)"
    ):
        SAE.from_pretrained(folder)
    save_file(dict(state, b_dec=torch.full((16,), float("nan"))), str(folder / WEIGHTS_FILENAME))
    with pytest.raises(CheckpointError, match="tensor 'b_dec' holds non-finite"):
        SAE.from_pretrained(folder)


def test_cfg_and_weights_from_different_saves_are_refused(tmp_path: Path) -> None:
    random_sae(10).save_model(tmp_path / "a")
    random_sae(11, architecture="standard", apply_b_dec_to_input=False).save_model(tmp_path / "b")
    (tmp_path / "a" / CFG_FILENAME).write_bytes((tmp_path / "b" / CFG_FILENAME).read_bytes())
    with pytest.raises(CheckpointError, match="was saved with another cfg.json"):
        SAE.from_pretrained(tmp_path / "a")


def test_missing_folder_or_file(tmp_path: Path) -> None:
    random_sae(12).save_model(tmp_path / "s")
    (tmp_path / "s" / WEIGHTS_FILENAME).unlink()
    with pytest.raises(FileNotFoundError, match=f"missing {WEIGHTS_FILENAME} \\(the folder holds: {CFG_FILENAME}\\)"):
        SAE.from_pretrained(tmp_path / "s")


def test_a_failed_save_writes_nothing_half(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    old, new = random_sae(13), random_sae(14)
    old.save_model(tmp_path / "kept")
    before = {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()}

    def full_disk(tensors: object, path: str, metadata: object = None) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        new.save_model(tmp_path / "kept")
    assert {p.name: p.read_bytes() for p in (tmp_path / "kept").iterdir()} == before  # old files, no temporaries
    with pytest.raises(OSError, match="No space left"):
        new.save_model(tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()  # no empty or half folder left behind
    monkeypatch.undo()
    with pytest.raises(NotADirectoryError, match="is a file; expected a folder"):
        new.save_model(tmp_path / "kept" / CFG_FILENAME)
