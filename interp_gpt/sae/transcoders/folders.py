"""Which existing folder a transcoder set may replace: one that reads as a set of that kind, by what its
files say, not by their names alone. `save_transcoders`, `save_clt` and `train-transcoder --out` (before
it trains) all ask `check_replaceable`; anything else there (an experiment's own config.yaml or
metrics.json, an SAE's folder, a CLT where a per-layer set goes) is refused, naming the folder and the
entry, before anything is written.

    per-layer set ("plt"):  layer_{L}/ (a transcoder's cfg.json + sae_weights.safetensors), cfg.json of a
                            transcoder (+ sae_weights.safetensors), config.yaml of a circuit-tracer
                            transcoder_set, layer_{L}.safetensors
    cross-layer ("clt"):    config.yaml of a circuit-tracer CLT, W_enc_{L}.safetensors, W_dec_{L}.safetensors
    both:                   metrics.json that train-transcoder wrote for that kind, last_good/ (such a set)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..common import CFG_FILENAME, WEIGHTS_FILENAME
from .config import SAELENS_ARCHITECTURES, TRANSCODER_ARCHITECTURES

__all__ = ["CLT_KIND", "CLT_EXT_KIND", "SET_KINDS", "replace_problem", "check_replaceable", "refusal"]

CLT_KIND, CLT_EXT_KIND = "cross_layer_transcoder", "interp_gpt.cross_layer_transcoder"  # config.yaml's model_kind
SET_KINDS = ("plt", "clt")
_CT_CONFIG = "config.yaml"
_WEIGHTS = {"plt": re.compile(r"^layer_\d+\.safetensors$"), "clt": re.compile(r"^W_(enc|dec)_\d+\.safetensors$")}
_WHAT = {"plt": "a per-layer transcoder set", "clt": "a cross-layer transcoder"}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _transcoder_cfg(path: Path) -> bool:
    """A sae-lens cfg.json of a transcoder (d_out and a transcoder's architecture; an SAE's has no d_out)."""
    d = _json(path)
    arch = d.get("architecture") if isinstance(d, dict) else None
    return isinstance(d, dict) and "d_out" in d and arch in (*SAELENS_ARCHITECTURES, *TRANSCODER_ARCHITECTURES)


def _ct_config(path: Path, kind: str) -> bool:
    """A circuit-tracer config.yaml of `kind`: a transcoder_set naming its hooks, or a CLT."""
    import yaml

    try:
        d = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    if not isinstance(d, dict) or "feature_input_hook" not in d:
        return False
    model_kind = d.get("model_kind", "transcoder_set")
    return model_kind in ((CLT_KIND, CLT_EXT_KIND) if kind == "clt" else ("transcoder_set",))


def _metrics(path: Path, kind: str) -> bool:
    """A metrics.json train-transcoder wrote for a set of `kind` (its "kind": plt, skip or clt)."""
    d = _json(path)
    if not isinstance(d, dict) or "command" not in d or d.get("kind") not in ("plt", "skip", "clt"):
        return False
    return (d["kind"] == "clt") == (kind == "clt")


def _entry_problem(q: Path, kind: str) -> str | None:
    """Why the entry `q` of a folder is not part of a set of `kind` (None: it is)."""
    name = q.name
    if q.is_dir():
        if name == "last_good":
            inner_problem = replace_problem(q, kind)
            return None if inner_problem is None else f"last_good/{inner_problem[1]}"
        if kind == "plt" and re.match(r"^layer_\d+$", name):
            inner = sorted(p.name for p in q.iterdir())
            if _transcoder_cfg(q / CFG_FILENAME) and set(inner) <= {CFG_FILENAME, WEIGHTS_FILENAME}:
                return None
            return f"{name}/ is not a transcoder's sae-lens folder (it holds {', '.join(inner[:4]) or 'nothing'})"
        return f"{name}/ is no part of {_WHAT[kind]}"
    if _WEIGHTS[kind].match(name) or (kind == "plt" and name == WEIGHTS_FILENAME):
        return None
    if name == _CT_CONFIG:
        ok = _ct_config(q, kind)
        return None if ok else f"{name} is not circuit-tracer's config of {_WHAT[kind]}"
    if name == CFG_FILENAME and kind == "plt":
        return None if _transcoder_cfg(q) else f"{name} is not a transcoder's sae-lens config (an SAE's?)"
    if name == "metrics.json":
        ok = _metrics(q, kind)
        return None if ok else f"{name} is not what train-transcoder wrote for {_WHAT[kind]}"
    return f"{name} is no part of {_WHAT[kind]}"


def replace_problem(folder: Path, kind: str) -> tuple[str, str] | None:
    """(entry, why) of the first entry of `folder` that keeps a transcoder set of `kind` ("plt" or "clt")
    from replacing it; None where the folder does not exist, is empty, or reads as such a set (what
    save_transcoders / save_clt / train-transcoder wrote).

    Example:
        >>> run = Path("experiments/run_1")
        >>> run.mkdir(parents=True)
        >>> _ = (run / "config.yaml").write_text("lr: 0.001\\n")
        >>> replace_problem(run, "plt")
        ('config.yaml', "config.yaml is not circuit-tracer's config of a per-layer transcoder set")
    """
    if kind not in SET_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(SET_KINDS)}")
    if not folder.exists():
        return None
    if not folder.is_dir():
        return folder.name, "it is a file"
    for q in sorted(folder.iterdir()):
        why = _entry_problem(q, kind)
        if why is not None:
            return q.name, why
    return None


def check_replaceable(folder: Path, kind: str, arg: str = "path") -> None:
    """Refuse (FileExistsError naming `arg`, the folder and the entry) to replace a folder that does not
    read as a transcoder set of `kind` (see `replace_problem`), before anything is written.

    Example:
        >>> run = Path("experiments/run_1")
        >>> run.mkdir(parents=True)
        >>> _ = (run / "metrics.json").write_text('{"loss": 0.5}')
        >>> check_replaceable(run, "plt")
        Traceback (most recent call last):
        FileExistsError: path='experiments/run_1' holds other files (metrics.json): ...
    """
    problem = replace_problem(folder, kind)
    if problem is not None:
        raise FileExistsError(refusal(folder, kind, arg, problem))


def refusal(folder: Path, kind: str, arg: str, problem: tuple[str, str]) -> str:
    """The message refusing to replace `folder` (`arg`) for `problem` (replace_problem's)."""
    if not folder.is_dir():
        return f"{arg}={str(folder)!r} is a file; expected a folder to save {_WHAT[kind]} in"
    return (
        f"{arg}={str(folder)!r} holds other files ({problem[0]}): {problem[1]}; a folder is replaced only when "
        f"it reads as {_WHAT[kind]} (what save_transcoders / save_clt / train-transcoder wrote): save into a new "
        "or empty folder"
    )
