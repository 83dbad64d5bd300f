"""Issue 36 leftovers: one rule for the model an SAE / transcoder / CLT was made for, with a way on; and
centring judged at the precision the weights hold, in steering and the tuned lens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.sae import SAE, load_clt, load_transcoders, save_clt, save_transcoders
from interp_gpt.sae.training.data import shipped_clt, shipped_sae, shipped_transcoders

TOKENS = torch.tensor([[1, 2, 3, 4, 5, 6]])


def _my_gpt2() -> GPT:
    """tiny-gpt2 under another name, as a copy loaded from a local folder (./my-gpt2) would be."""
    model = GPT.from_pretrained("tiny-gpt2")
    model.cfg.model_name = "my-gpt2"
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("names")
    shipped_sae().save_model(root / "sae")
    save_transcoders(shipped_transcoders(), root / "tcs")
    save_clt(shipped_clt(), root / "clt")
    return {"sae": root / "sae", "tcs": root / "tcs", "clt": root / "clt"}


def _refusal(loader: str) -> str:
    return (
        r"is for 'tiny-gpt2' \(its cfg\.metadata\.model_name\) but the model is 'my-gpt2': .*"
        r"set its cfg\.metadata\.model_name = 'my-gpt2' .*"
        + loader.replace(".", r"\.")
        + r"\(\.\.\., model_name='my-gpt2'\)"
    )


def test_sae_transcoders_and_clt_made_for_another_model_are_refused_alike(folders: dict[str, Path]) -> None:
    model = _my_gpt2()
    with pytest.raises(ValueError, match="sae: the SAE " + _refusal("SAE.from_pretrained")):
        model.add_sae(SAE.from_pretrained(folders["sae"]))
    assert model.acts_to_saes == {}
    with pytest.raises(ValueError, match="the transcoder of layer 0 " + _refusal("load_transcoders")):
        load_transcoders(folders["tcs"], model)
    with pytest.raises(ValueError, match=_refusal("load_transcoders")):
        with model.transcoders(load_transcoders(folders["tcs"])):
            pass
    with pytest.raises(ValueError, match=_refusal("load_clt")):
        with model.transcoders(load_clt(folders["clt"])):
            pass
    assert model.acts_to_saes == {}


def test_the_loaders_model_name_lets_them_load_and_run(folders: dict[str, Path]) -> None:
    model = _my_gpt2()
    plain = model(TOKENS)
    sae = SAE.from_pretrained(folders["sae"], model_name="my-gpt2")
    assert sae.cfg.metadata.model_name == "my-gpt2"
    with model.saes([sae]):
        assert model(TOKENS).shape == plain.shape
    tcs = load_transcoders(folders["tcs"], model, model_name="my-gpt2")
    assert [tc.cfg.model_name for tc in tcs] == ["my-gpt2"] * len(tcs)
    with model.transcoders(tcs):
        assert torch.isfinite(model(TOKENS)).all()
    clt = load_clt(folders["clt"], model_name="my-gpt2")
    assert clt.cfg.model_name == "my-gpt2"
    with model.transcoders(clt):
        assert torch.isfinite(model(TOKENS)).all()
    torch.testing.assert_close(model(TOKENS), plain)
    for bad, err in ((3, TypeError), ("  ", ValueError)):
        with pytest.raises(err, match="load_clt: model_name"):
            load_clt(folders["clt"], model_name=bad)  # type: ignore[arg-type]


def test_setting_the_metadata_is_the_other_way_on(folders: dict[str, Path]) -> None:
    model = _my_gpt2()
    sae = SAE.from_pretrained(folders["sae"])
    sae.cfg.metadata.model_name = model.cfg.model_name
    model.add_sae(sae)
    model.reset_saes()
    tcs = load_transcoders(folders["tcs"])
    for tc in tcs:
        tc.cfg.metadata.model_name = model.cfg.model_name
    with model.transcoders(tcs):
        model(TOKENS)
    clt = load_clt(folders["clt"])
    clt.cfg.metadata.model_name = model.cfg.model_name
    with model.transcoders(clt):
        model(TOKENS)


@pytest.mark.parametrize("name", ["", "custom"])
def test_a_model_that_names_none_refuses_nothing(folders: dict[str, Path], name: str) -> None:
    model = GPT.from_pretrained("tiny-gpt2")
    model.cfg.model_name = name
    sae = SAE.from_pretrained(folders["sae"])
    model.add_sae(sae)
    model.reset_saes()
    with model.transcoders(load_transcoders(folders["tcs"], model)):
        model(TOKENS)
    with model.transcoders(load_clt(folders["clt"])):
        model(TOKENS)


# ----------------------------------------------------------------------------------------------
# Centring judged at the precision the weights hold (a float32-processed model cast to float64)
# ----------------------------------------------------------------------------------------------
def test_steering_reads_a_processed_model_cast_to_float64_as_processed() -> None:
    from interp_gpt.steering import map_direction

    model = GPT.from_pretrained("tiny-gpt2")
    wide = GPT.from_pretrained("tiny-gpt2").to(torch.float64)
    torch.manual_seed(0)
    v = torch.randn(model.cfg.d_model)
    logit = torch.randn(model.cfg.d_vocab)
    for hook, u in (("blocks.1.hook_resid_pre", v), ("unembed.hook_out", logit), ("unembed.hook_in", v)):
        for a, b in ((model, wide), (wide, model)):  # processed alike: as it is, both ways
            torch.testing.assert_close(map_direction(u, a, b, hook), u)
    raw, raw_wide = GPT.from_pretrained_no_processing("tiny-gpt2"), GPT.from_pretrained_no_processing("tiny-gpt2")
    raw_wide = raw_wide.to(torch.float64)
    torch.testing.assert_close(
        map_direction(v, wide, raw_wide, "blocks.1.hook_resid_pre"),
        map_direction(v, model, raw, "blocks.1.hook_resid_pre"),
    )


def test_the_tuned_lens_reads_a_processed_model_cast_to_float64_as_processed(tmp_path: Path) -> None:
    from interp_gpt.lenses import TunedLens, lens_processing

    model = GPT.from_pretrained("tiny-gpt2")
    wide = GPT.from_pretrained("tiny-gpt2").to(torch.float64)
    assert lens_processing(wide) == lens_processing(model) == {
        "fold_ln": True, "center_writing_weights": True, "center_unembed": True,
    }  # fmt: skip
    raw = GPT.from_pretrained_no_processing("tiny-gpt2").to(torch.float64)
    assert not lens_processing(raw)["center_writing_weights"]  # raw weights still read as raw
    TunedLens.from_model(model).save(tmp_path / "lens")
    TunedLens.from_pretrained(tmp_path / "lens", wide)  # trained on the centred stream: not refused
