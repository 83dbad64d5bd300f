"""Whether an SAE fits a model: the hook it reads, that hook's width, the model it was trained on.

`fit_hook` is the check behind `check_sae_fits` (splice.py, which adds "is it an SAE") and behind
`SAE.splice_hooks` (core.py), the method the splicing mechanism (interp_gpt.model.splicing) calls. It lives
here, importing neither, so that both can use it without an import circle. `hook_width` is the width of
a hook's activations, for any module read or written at a hook (a transcoder's input and output too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...utils import hook_shape
from ..names import check_model_name

if TYPE_CHECKING:
    from ...config import Config

__all__ = ["fit_hook", "hook_width"]


def hook_width(cfg: Config, name: str) -> int | None:
    """The last dimension of the activation at hook `name` (None: it has no fixed width)."""
    shape = hook_shape(cfg, name)
    return None if shape is None else shape[-1]


def fit_hook(model: Any, sae: Any, arg: str = "sae") -> str:
    """The hook `sae` (an SAE: not checked here) reads, once it is known to fit `model`.

    Refuses by name: no `cfg.metadata.hook_name`, an SAE's own hook point, a hook of no fixed width,
    `d_in` other than the hook's width, a `cfg.metadata.model_name` naming another model than
    `model.cfg.model_name` (ValueError, see interp_gpt.sae.names); a hook the model lacks (KeyError, with
    the close names).
    """
    name = sae.cfg.hook_name
    if name is None:
        raise ValueError(
            f"{arg}.cfg.metadata.hook_name is not set: set it to the hook the SAE reads "
            f"(e.g. {arg}.cfg.metadata.hook_name = 'blocks.1.hook_resid_pre')"
        )
    if any(name.endswith("." + n) for n in sae.hook_names):
        raise ValueError(
            f"{arg}.cfg.metadata.hook_name={name!r} is an SAE's own hook point; splice SAEs at the model's"
        )
    if name not in model.hook_dict:
        raise KeyError(f"{arg}.cfg.metadata.hook_name: {model._unknown_hook_error(name).args[0]}")
    cfg = model.cfg
    width = hook_width(cfg, name)
    if width is None:
        raise ValueError(
            f"{arg}.cfg.metadata.hook_name={name!r}: that activation has no fixed width to splice an SAE into"
        )
    if sae.cfg.reshape_activations == "hook_z":
        if not name.endswith(("hook_q", "hook_k", "hook_v", "hook_z")):
            raise ValueError(f"reshape_activations='hook_z' needs a per-head hook (hook_z ...), got {name!r}")
        width = width * cfg.n_heads
    if sae.cfg.d_in != width:
        raise ValueError(
            f"{arg}.cfg.d_in={sae.cfg.d_in} does not fit {name!r}, whose activations are {width} wide "
            f"(d_model={cfg.d_model}, d_mlp={cfg.d_mlp}, d_head={cfg.d_head})"
        )
    check_model_name(sae.cfg.metadata.get("model_name"), model, f"{arg}: the SAE", "SAE.from_pretrained")
    return name
