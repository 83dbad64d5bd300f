"""The architecture registry: each architecture owns its config fields, and another's is refused by name."""

from __future__ import annotations

import pytest

from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.saes.architectures import ARCHITECTURES, FIELD_OWNERS, get_architecture

META = {"hook_name": "blocks.0.hook_resid_pre"}


def test_a_field_of_another_architecture_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"k=8 is a field of topk.* SAEs, not of a 'standard' one"):
        SAEConfig(d_in=8, d_sae=16, k=8, metadata=META)
    with pytest.raises(ValueError, match=r"rescale_acts_by_decoder_norm=True is a field of topk"):
        SAEConfig(d_in=8, d_sae=16, architecture="jumprelu", rescale_acts_by_decoder_norm=True, metadata=META)
    assert SAEConfig(d_in=8, d_sae=128, architecture="topk", metadata=META).k == 100  # sae-lens' default


def test_an_unknown_architecture_names_the_close_ones() -> None:
    with pytest.raises(ValueError, match=r"architecture='topkk' is not supported \(did you mean 'topk'"):
        get_architecture("topkk")
    with pytest.raises(ValueError, match=r"architecture='nope' is not supported; expected one of standard"):
        SAEConfig(d_in=8, d_sae=16, architecture="nope", metadata=META)


def test_every_architecture_builds_and_says_its_fields_in_cfg_json() -> None:
    for name in ARCHITECTURES:
        sae = SAE(SAEConfig(d_in=8, d_sae=16, architecture=name, **_small(name), metadata=META))
        written = sae.cfg.to_dict()
        assert written["architecture"] == name
        for field, owners in FIELD_OWNERS.items():
            assert (field in written) == (name in owners), (name, field)


def _small(name: str) -> dict[str, object]:
    """Fields an architecture needs to fit d_sae=16."""
    fields = get_architecture(name).fields
    return {
        **({"k": 4} if "k" in fields else {}),
        **({"matryoshka_widths": [4, 16]} if "matryoshka_widths" in fields else {}),
    }
