"""Splicing SAEs into the model: `add_sae`, `reset_saes`, `with model.saes([...])` (sae-lens' /
transformer-lens' HookedSAETransformer names).

The mechanism is interp_gpt.model.splicing, below the feature packages (the model imports nothing from this package); it
splices any module that follows its protocol, as `SAE` does (`SAE.splice_hooks`, `SAE.splice_forward`).
While spliced, the model's hook point at `sae.cfg.hook_name` (say `blocks.1.hook_resid_pre`) passes the
activation through the SAE, whose hook points hang under it and join `model.hook_dict`:

    blocks.1.hook_resid_pre                      the model's activation (hooks here run first, then the SAE)
    blocks.1.hook_resid_pre.hook_sae_input       what the SAE reads     [..., d_in]
    blocks.1.hook_resid_pre.hook_sae_acts_pre    encoder pre-activations [..., d_sae]
    blocks.1.hook_resid_pre.hook_sae_acts_post   feature activations    [..., d_sae]
    blocks.1.hook_resid_pre.hook_sae_recons      the reconstruction     [..., d_in]
    blocks.1.hook_resid_pre.hook_sae_error       x - reconstruction     (use_error_term=True only)
    blocks.1.hook_resid_pre.hook_sae_output      what flows downstream  [..., d_in]

(the error term, gradients, threads: see interp_gpt.model.splicing). This module keeps the SAE's own check,
`check_sae_fits`, and the names that were public here.
"""

from __future__ import annotations

from typing import Any

from ...model.splicing import SplicedHookPoint, SplicingMixin
from .core import SAE
from .fit import fit_hook

__all__ = ["SAESplicingMixin", "SplicedHookPoint", "check_sae_fits"]

SAESplicingMixin = SplicingMixin  # GPT's splicing methods (the mechanism, for SAEs and transcoders)


def check_sae_fits(model: Any, sae: Any, arg: str = "sae") -> str:
    """The hook `sae` reads, once it is known to fit `model`; the one check every user of an SAE on a
    model shares (`add_sae`, `feature_report`, `interp-gpt features`).

    Refuses by name: not an SAE (TypeError); no `cfg.metadata.hook_name`, an SAE's own hook point,
    a hook of no fixed width, `d_in` other than the hook's width (ValueError); a hook the model lacks
    (KeyError, with the close names). Warns when `cfg.metadata.model_name` names another model than
    `model.cfg.model_name` (aliases such as "gpt2-small" for "gpt2", and an "owner/" prefix, aside).
    """
    if not isinstance(sae, SAE):
        raise TypeError(f"{arg}: expected an interp_gpt.sae.SAE, got {type(sae).__name__}")
    return fit_hook(model, sae, arg)
