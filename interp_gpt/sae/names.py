"""Whether an SAE, a transcoder or a CLT was made for the model it is used on: one rule for all three.

The record is the object's `cfg.metadata.model_name` (the model it was trained on), compared with the
model's `cfg.model_name`: aliases ("gpt2-small" for "gpt2"), case and an "owner/" prefix aside. Another
model's is refused, by name, with the way on for a model that is the same one under another name (a copy
of GPT-2 loaded from ./my-gpt2): set the object's `cfg.metadata.model_name` to the model's name, or say so
when loading (`SAE.from_pretrained(..., model_name=...)`, `load_transcoders(..., model_name=...)`,
`load_clt(..., model_name=...)`). A model that names none ("" or "custom") refuses nothing.
"""

from __future__ import annotations

from typing import Any

from ..checkpoints.sources import hub_id

__all__ = ["model_key", "names_other_model", "check_model_name", "set_model_name"]


def model_key(name: str) -> str:
    """A model name as compared: its last path part, lower case, transformer-lens' aliases resolved."""
    return hub_id(name.strip().rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower())


def names_other_model(trained_on: Any, model_name: Any) -> bool:
    """Whether `trained_on` (a cfg.metadata.model_name) names another model than `model_name` (a model's
    cfg.model_name; "" and "custom" name no model)."""
    return (
        isinstance(trained_on, str)
        and bool(trained_on)
        and isinstance(model_name, str)
        and model_name not in ("", "custom")
        and model_key(trained_on) != model_key(model_name)
    )


def check_model_name(trained_on: Any, model: Any, where: str, loader: str) -> None:
    """Refuse (ValueError) an object whose cfg.metadata.model_name `trained_on` names another model than
    `model`'s cfg.model_name. `where` names the object ("sae: the SAE"), `loader` the function whose
    `model_name=` argument says, when loading, which model it is for ("SAE.from_pretrained")."""
    model_name = getattr(getattr(model, "cfg", None), "model_name", None)
    if names_other_model(trained_on, model_name):
        raise ValueError(
            f"{where} is for {trained_on!r} (its cfg.metadata.model_name) but the model is {model_name!r}: "
            f"if it was made for this model, say so: set its cfg.metadata.model_name = {model_name!r} "
            f"(model.cfg.model_name), or load it with {loader}(..., model_name={model_name!r})"
        )


def set_model_name(metadata: Any, model_name: str | None, caller: str) -> None:
    """Record `model_name` (a loader's `model_name=` argument: None keeps the file's) in `metadata`."""
    if model_name is None:
        return
    if not isinstance(model_name, str):
        raise TypeError(
            f"{caller}: model_name: expected a model's name (a str) or None, got {type(model_name).__name__}"
        )
    if not model_name.strip():
        raise ValueError(f"{caller}: model_name={model_name!r}: expected a model's name (e.g. 'gpt2') or None")
    metadata["model_name"] = model_name
