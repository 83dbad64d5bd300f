"""Transcoder files: sae-lens' folders and circuit-tracer's transcoder sets, read and written whole.

**sae-lens 6** (one transcoder per folder): `cfg.json` (see TranscoderConfig: "architecture" is
"transcoder", "skip_transcoder", "jumprelu_transcoder" or "jumprelu_skip_transcoder"; this package
adds "topk_transcoder" / "topk_skip_transcoder" with `k`, which sae-lens 6.54 cannot load) and
`sae_weights.safetensors`: W_enc [d_in, d_sae], W_dec [d_sae, d_out], b_enc [d_sae], b_dec [d_out],
W_skip [d_out, d_in] (skip), threshold [d_sae] (JumpReLU). sae-lens' JumpReLU applies a ReLU too.

**circuit-tracer** (read from safety-research/circuit-tracer's `utils/hf_utils.py`, `utils/caching.py`
and `transcoder/single_layer_transcoder.py`): a folder with `config.yaml`

    model_name: gpt2
    model_kind: transcoder_set
    feature_input_hook: ln2.hook_normalized      # relative to blocks.{layer}
    feature_output_hook: hook_mlp_out
    activation: topk                             # optional: relu | topk; else JumpReLU if a threshold is stored
    k: 32                                        # topk only
    transcoders: [layer_0.safetensors, ...]      # optional: the file of layer i; else layer_{i}.safetensors
    model_processing: {fold_ln: false, center_writing_weights: false}   # this package's (circuit-tracer
                                                 # ignores unknown keys): the weights it is for; raw if absent

and one safetensors file per layer holding W_enc [d_sae, d_in] (its F.linear layout, transposed
here), W_dec [d_sae, d_out], b_enc, b_dec, optional W_skip [d_out, d_in] and
`activation_function.threshold` [d_sae]. circuit-tracer 0.5.0 has TopK in memory only: its loader
ignores `activation` / `k` and builds a ReLU from such a file, so a TopK layer file also holds `k`, a
0-d tensor (as circuit-tracer's later TopK writer stores it), which 0.5.0's strict load_state_dict
refuses rather than misreading. Its JumpReLU
is `h * (h > threshold)` and its TopK keeps the k largest values as they are: no ReLU
(`nonnegative_acts=False`). Its older list of `{id, layer, filepath}` entries reads too; `activation_function`
reads as a synonym of `activation`. Hub paths (hf://...) are not fetched: download them first.

Reading checks everything before building anything: the config, then each tensor's name, shape and
finiteness, each error naming the file. A set is written into a temporary folder beside the target
and takes the target's name only when every file is whole (files through interp_gpt.files).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...checkpoints.sources import CheckpointError, config_digest
from ...files import atomic_folder, atomic_path
from ..common import (
    CFG_FILENAME,
    DIGEST_KEY,
    WEIGHTS_FILENAME,
    SAEMetadata,
    check_digest,
    check_tensors,
    config_from_file,
    dtype_name,
    read_safetensors,
    removed_if_left_empty,
)
from ..common import (
    cast_state as cast_state,
)
from ..mapped import FileWeight, MappedState, map_safetensors
from .config import PROCESSING_KEY, TranscoderConfig, parse_processing, transcoder_shapes
from .folders import check_replaceable

__all__ = [
    "SCAN_KEY",
    "check_scan",
    "transcoders_scan",
    "CT_CONFIG_FILENAME",
    "FORMATS",
    "read_transcoder_files",
    "read_saelens_folder",
    "read_circuit_tracer",
    "write_saelens_folder",
    "write_transcoder_set",
]

CT_CONFIG_FILENAME = "config.yaml"
FORMATS = ("saelens", "circuit-tracer")
_CT_THRESHOLD = "activation_function.threshold"
# circuit-tracer's replacement MLP wraps the MLP with hook_in / hook_out. hook_out is our hook_mlp_out;
# hook_in, the MLP's input, is ln2.hook_normalized only on folded weights (x_hat * w + b on raw ones), so
# it stays mlp.hook_in unless the set says fold_ln (the splice reads it exactly: see transcoder_processing).
_CT_ALIASES = {"mlp.hook_out": "hook_mlp_out"}
_CT_FOLDED_ALIASES = {"mlp.hook_in": "ln2.hook_normalized"}
_LAYER_FILE = re.compile(r"^layer_(\d+)\.safetensors$")

Item = tuple[TranscoderConfig, dict[str, Tensor]]


# ----------------------------------------------------------------------------------------------
# Checking a state dict against its config
# ----------------------------------------------------------------------------------------------
def check_state(state: dict[str, Tensor], cfg: TranscoderConfig, where: str | Path) -> None:
    """Refuse, naming the file, missing / unexpected / mis-shaped tensors and non-finite values."""
    kind = f"{cfg.architecture}{' skip' if cfg.skip else ''} transcoder"
    what = f"its tensors do not fit a {kind} with d_in={cfg.d_in}, d_sae={cfg.d_sae}, d_out={cfg.d_out}: "
    check_tensors(state, transcoder_shapes(cfg), where, what)


def save_safetensors(path: Path, state: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """One metadata key at most: safetensors writes several in a random order, and a set saved
    twice should be the same bytes."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata or {"format": "pt"})


# ----------------------------------------------------------------------------------------------
# sae-lens
# ----------------------------------------------------------------------------------------------
_LAZY = ("W_enc", "W_dec")  # what a lazily loaded transcoder keeps mapped (the rest is small: read now)


def read_saelens_folder(folder: Path, device: str | torch.device = "cpu", lazy: bool | None = False) -> Item:
    """The config and state dict of a sae-lens transcoder folder, checked against each other (`lazy`: its
    W_enc and W_dec mapped, a `MappedState`)."""
    cfg_path, weights_path = folder / CFG_FILENAME, folder / WEIGHTS_FILENAME
    missing = [p.name for p in (cfg_path, weights_path) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{folder}: a sae-lens transcoder folder needs {CFG_FILENAME} and {WEIGHTS_FILENAME}; missing "
            f"{', '.join(missing)}"
        )
    text = cfg_path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from e
    cfg: TranscoderConfig = config_from_file(TranscoderConfig, raw, cfg_path)
    state, meta = read_safetensors(weights_path, device) if lazy is False else map_safetensors(weights_path)
    if lazy is not False:  # sae-lens' layout is the transcoder's: both matrices map exactly
        state = MappedState(state, {k: FileWeight(str(weights_path), k) for k in _LAZY})
    check_digest(meta, cfg_path, "transcoder", text)
    check_state(state, cfg, weights_path)
    return cfg, _cast(state, cfg.torch_dtype)


def _cast(state: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
    """`state` in `dtype`, a MappedState's file records kept (a cast tensor is no longer its file's)."""
    out = {k: v.to(dtype) for k, v in state.items()}
    files = getattr(state, "files", None)
    return out if files is None else MappedState(out, files)


def _saelens_ready(cfg: TranscoderConfig, state: dict[str, Tensor], where: str) -> None:
    """sae-lens' JumpReLU transcoder clamps at 0: one that keeps negative values computes the same
    numbers there only if no threshold is negative."""
    if cfg.architecture == "jumprelu" and not cfg.nonnegative_acts and bool((state["threshold"] < 0).any()):
        raise ValueError(
            f"{where}: nonnegative_acts=False with negative thresholds (min {state['threshold'].min().item():.4g}) "
            "has no exact form in sae-lens' format (its JumpReLU transcoder applies a ReLU); save it with "
            "format='circuit-tracer'"
        )


def write_saelens_folder(folder: Path, cfg: TranscoderConfig, state: dict[str, Tensor]) -> tuple[Path, Path]:
    """Write cfg.json and sae_weights.safetensors into `folder`, each whole or not at all; the weights
    record the sha256 of their cfg.json (a folder mixing two saves is refused when read)."""
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"path: {str(folder)!r} is a file; expected a folder to save the transcoder in")
    _saelens_ready(cfg, state, f"path={str(folder)!r}")
    text = json.dumps(cfg.to_dict(), indent=2)
    weights_path, cfg_path = folder / WEIGHTS_FILENAME, folder / CFG_FILENAME
    # Both files are whole before either takes its name; the weights name the digest of the
    # cfg.json they go with, so a crash between the two renames is caught when the folder is read.
    with removed_if_left_empty(folder), atomic_path(cfg_path) as ctmp:
        ctmp.write_text(text, encoding="utf-8")
        save_safetensors(weights_path, state, {DIGEST_KEY: config_digest(text)})
    return weights_path, cfg_path


# ----------------------------------------------------------------------------------------------
# circuit-tracer
# ----------------------------------------------------------------------------------------------
def _ct_hook(rel: Any, key: str, where: Path) -> str:
    if not isinstance(rel, str) or not rel:
        raise CheckpointError(f"{where}: {key}={rel!r}: expected a hook name relative to blocks.L, e.g. 'hook_mlp_out'")
    rel = _CT_ALIASES.get(rel, rel)
    if rel.startswith("blocks.") and "{layer}" not in rel:
        raise CheckpointError(
            f"{where}: {key}={rel!r}: expected a name relative to blocks.L (e.g. 'ln2.hook_normalized') "
            "or a template 'blocks.{layer}....'"
        )
    return rel


def _full_hook(rel: str, layer: int) -> str:
    return rel.format(layer=layer) if "{layer}" in rel else f"blocks.{layer}.{rel}"


def _ct_files(config: dict[str, Any], folder: Path, where: Path) -> list[tuple[int, Path]]:
    """(layer, file) for every transcoder the config lists, or the folder's layer_{i}.safetensors."""
    listed = config.get("transcoders")
    out: list[tuple[int, Path]] = []
    if listed is None:
        for p in sorted(folder.iterdir()):
            m = _LAYER_FILE.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
        if not out:
            raise CheckpointError(f"{where}: lists no transcoders and {folder} holds no layer_<i>.safetensors")
    elif not isinstance(listed, list) or not listed:
        raise CheckpointError(f"{where}: transcoders={listed!r}: expected a list of per-layer files")
    else:
        for i, entry in enumerate(listed):
            if isinstance(entry, dict):  # circuit-tracer's older form: {id, layer, filepath}
                layer, file = entry.get("layer"), entry.get("filepath")
                if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
                    raise CheckpointError(f"{where}: transcoders[{i}].layer={layer!r}: expected a layer index >= 0")
            else:
                layer, file = i, entry
            if not isinstance(file, str) or not file:
                raise CheckpointError(f"{where}: transcoders[{i}]={entry!r}: expected a file path")
            if file.startswith("hf://"):
                raise CheckpointError(
                    f"{where}: transcoders[{i}]={file!r} is on the Hugging Face hub, which is not fetched here: "
                    "download it and list the local file"
                )
            path = Path(file).expanduser()
            out.append((layer, path if path.is_absolute() else folder / path))
    seen: dict[int, Path] = {}
    for layer, path in out:
        if layer in seen:
            raise CheckpointError(f"{where}: layer {layer} is given twice ({seen[layer].name} and {path.name})")
        seen[layer] = path
    return out


def _ct_activation(config: dict[str, Any], where: Path) -> str | None:
    values = {k: config[k] for k in ("activation", "activation_function") if config.get(k) is not None}
    if len(set(map(str, values.values()))) > 1:
        raise CheckpointError(
            f"{where}: activation={values['activation']!r} but activation_function="
            f"{values['activation_function']!r}: give one"
        )
    v = next(iter(values.values()), None)
    if v is None:
        return None
    names = {"relu": "relu", "topk": "topk", "jumprelu": "jumprelu", "jump_relu": "jumprelu"}
    if not isinstance(v, str) or v.lower() not in names:
        raise CheckpointError(f"{where}: activation={v!r}: expected one of relu, jumprelu, topk")
    return names[v.lower()]


def read_circuit_tracer(path: Path, device: str | torch.device = "cpu", lazy: bool | None = False) -> list[Item]:
    """Every transcoder of a circuit-tracer set (`path`: its config.yaml, or the folder holding it). `lazy`
    None: each W_dec mapped (a `MappedState`), W_enc read (the file holds its transpose); True: W_enc mapped
    too, as the transposed view of the file's; False: everything read."""
    import yaml

    cfg_path = path / CT_CONFIG_FILENAME if path.is_dir() else path
    folder = cfg_path.parent
    try:
        config = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path}: not valid YAML ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: expected a YAML mapping, got {type(config).__name__}")
    kind = config.get("model_kind", "transcoder_set")
    if kind != "transcoder_set":
        raise CheckpointError(
            f"{cfg_path}: model_kind={kind!r}: load_transcoders reads per-layer sets ('transcoder_set'); "
            "load a cross-layer transcoder with load_clt"
        )
    rel_in = _ct_hook(config.get("feature_input_hook"), "feature_input_hook", cfg_path)
    rel_out = _ct_hook(config.get("feature_output_hook"), "feature_output_hook", cfg_path)
    try:  # this package's key (circuit-tracer ignores it); a set that does not say is for raw weights
        processing = parse_processing(config.get(PROCESSING_KEY), f"{cfg_path}: {PROCESSING_KEY}")
    except (TypeError, ValueError) as e:
        raise CheckpointError(str(e)) from e
    if processing["fold_ln"]:
        rel_in = _CT_FOLDED_ALIASES.get(rel_in, rel_in)
    model_name = config.get("model_name")
    if model_name is not None and not isinstance(model_name, str):
        raise CheckpointError(f"{cfg_path}: model_name={model_name!r}: expected a string")
    activation = _ct_activation(config, cfg_path)
    k = config.get("k")
    scan = check_scan(config.get(SCAN_KEY), cfg_path)
    items = []
    for layer, file in sorted(_ct_files(config, folder, cfg_path)):
        if not file.is_file():
            raise FileNotFoundError(f"{cfg_path}: layer {layer}'s file {str(file)!r} does not exist")
        state: dict[str, Tensor]
        if lazy is not False or torch.device(device).type == "cpu":
            # W_enc is stored [d_sae, d_in]: lazy=True holds a transposed view of the map; else it is read
            # contiguous through a map of its own (the file's map keeps no page of it: never held twice)
            files = {"W_dec": FileWeight(str(file), "W_dec")} if lazy is not False else {}
            enc = FileWeight(str(file), "W_enc", transposed=True)
            state = MappedState(map_safetensors(file)[0], {**files, "W_enc": enc} if lazy else files)
            if not lazy:
                state["W_enc"] = enc.read().mT if state["W_enc"].ndim == 2 else state["W_enc"]
        else:
            state, _ = read_safetensors(file, device)
        meta: dict[str, Any] = {"hook_name": _full_hook(rel_in, layer), "hook_name_out": _full_hook(rel_out, layer)}
        meta[PROCESSING_KEY] = dict(processing)
        if model_name is not None:
            meta["model_name"] = model_name
        if scan is not None:  # circuit-tracer's name of the set (a graph's metadata.scan): kept, as it does
            meta[SCAN_KEY] = scan
        items.append(_ct_item(state, meta, activation, k, file))
    return items


def _ct_item(state: dict[str, Tensor], meta: dict[str, Any], activation: str | None, k: Any, file: Path) -> Item:
    """One circuit-tracer layer file as (config, state in sae-lens' layout)."""
    if "threshold" in state and _CT_THRESHOLD not in state:
        state[_CT_THRESHOLD] = state.pop("threshold")
    stored_k = state.pop("k", None)
    if stored_k is not None:
        if stored_k.numel() != 1 or stored_k.is_floating_point():
            raise CheckpointError(f"{file}: tensor 'k' {tuple(stored_k.shape)} {stored_k.dtype}: expected one integer")
        if k is not None and int(stored_k.item()) != k:
            raise CheckpointError(f"{file}: stores k={int(stored_k.item())} but its config says k={k!r}")
        k = int(stored_k.item())
        activation = activation or "topk"
    if activation is None:
        activation = "jumprelu" if _CT_THRESHOLD in state else "relu"
    for name, rank, axes in (("W_enc", 2, "[d_sae, d_in]"), ("b_enc", 1, "[d_sae]"), ("b_dec", 1, "[d_out]")):
        if name not in state:
            raise CheckpointError(
                f"{file}: missing tensor {name!r} (a circuit-tracer transcoder holds W_enc, W_dec, b_enc, b_dec)"
            )
        if state[name].ndim != rank:
            raise CheckpointError(f"{file}: {name} has shape {tuple(state[name].shape)}; expected {axes}")
    w_enc = state.pop("W_enc")
    # circuit-tracer's [d_sae, d_in] -> sae-lens' [d_in, d_sae] (lazy=True: a view of the map, read when used)
    state["W_enc"] = w_enc.T if "W_enc" in getattr(state, "files", {}) else w_enc.T.contiguous()
    if _CT_THRESHOLD in state:
        state["threshold"] = state.pop(_CT_THRESHOLD)
    dtype = w_enc.dtype if w_enc.is_floating_point() else torch.float32
    try:
        cfg = TranscoderConfig(
            d_in=int(w_enc.shape[1]),
            d_sae=int(state["b_enc"].shape[0]),
            d_out=int(state["b_dec"].shape[0]),
            architecture=activation,
            skip="W_skip" in state,
            k=k,
            nonnegative_acts=activation == "relu",  # circuit-tracer's JumpReLU and TopK keep negatives
            dtype=dtype_name(dtype),
            metadata=SAEMetadata(meta),
        )
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: {e}") from e
    check_state(state, cfg, file)
    return cfg, _cast(state, dtype)


def _ct_ready(items: list[Item]) -> dict[str, Any]:
    """The config.yaml of a set, once the set is one circuit-tracer can hold and compute exactly."""
    first = items[0][0]
    layers = [c.layer for c, _ in items]
    want = list(range(len(items)))
    if sorted(layers) != want:  # type: ignore[type-var]
        raise ValueError(
            f"format='circuit-tracer' holds the layers 0..n-1, one transcoder each; got layers {layers} "
            f"(missing {sorted(set(want) - set(layers))}); save them with format='saelens'"  # type: ignore[arg-type]
        )
    rel: dict[str, str] = {}
    for cfg, state in items:
        where = f"the transcoder of layer {cfg.layer}"
        for key, hook in (("feature_input_hook", cfg.input_hook), ("feature_output_hook", cfg.output_hook)):
            prefix = f"blocks.{cfg.layer}."
            if hook is None or not hook.startswith(prefix):
                raise ValueError(f"{where}: metadata hook {hook!r}: circuit-tracer needs hooks under {prefix}")
            r = hook[len(prefix) :]
            if rel.setdefault(key, r) != r:
                raise ValueError(
                    f"{where}: {key} {r!r} differs from another layer's {rel[key]!r}: circuit-tracer "
                    "reads one hook for every layer"
                )
        for field in ("architecture", "k", "skip", "d_sae", "model_name", "processing"):
            if getattr(cfg, field) != getattr(first, field):
                raise ValueError(
                    f"{where}: {field}={getattr(cfg, field)!r} but layer {first.layer}'s is "
                    f"{getattr(first, field)!r}: a circuit-tracer set shares it"
                )
        if cfg.architecture == "topk" and cfg.nonnegative_acts:
            raise ValueError(
                f"{where}: nonnegative_acts=True: circuit-tracer's TopK keeps negative values, so a ReLU'd TopK has "
                "no exact form in its format; save it with format='saelens'"
            )
        if cfg.architecture == "jumprelu" and cfg.nonnegative_acts and bool((state["threshold"] < 0).any()):
            raise ValueError(
                f"{where}: nonnegative_acts=True with negative thresholds has no exact form in circuit-tracer's "
                "format (its JumpReLU applies no ReLU); save it with format='saelens'"
            )
    config: dict[str, Any] = {}
    if first.model_name is not None:
        config["model_name"] = first.model_name
    config["model_kind"] = "transcoder_set"
    config.update(rel)
    config["activation"] = first.architecture
    if first.architecture == "topk":
        config["k"] = first.k
    config[PROCESSING_KEY] = first.processing  # the weights it is for (circuit-tracer ignores the key)
    scan = first.metadata.get(SCAN_KEY)
    if scan is not None and all(c.metadata.get(SCAN_KEY) == scan for c, _ in items):
        config[SCAN_KEY] = scan
    return config


SCAN_KEY = "scan"  # circuit-tracer's config.yaml key: the set's name, a graph's metadata.scan


def check_scan(value: Any, where: str | Path) -> str | list[str] | None:
    """A config's `scan` (circuit-tracer's name of a transcoder set): a string, a list of strings, or None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise CheckpointError(f"{where}: scan={value!r}: expected a string or a list of strings")


def transcoders_scan(transcoders: Any) -> str | list[str] | None:
    """The `scan` a set of transcoders was loaded with (circuit-tracer's config.yaml `scan`, kept in each
    cfg.metadata): a CrossLayerTranscoder's, or the one every transcoder of a list shares; else None.

    Example:
        >>> transcoders_scan(tcs) is None     # the shipped set names none
        True
    """
    cfgs = [transcoders.cfg] if hasattr(transcoders, "cfg") else [getattr(t, "cfg", None) for t in transcoders]
    scans = [c.metadata.get(SCAN_KEY) if c is not None else None for c in cfgs]
    return scans[0] if scans and all(x == scans[0] for x in scans) else None


# ----------------------------------------------------------------------------------------------
# Sets: where a path points, and writing a set whole
# ----------------------------------------------------------------------------------------------
def read_transcoder_files(path: Any, device: str | torch.device = "cpu", lazy: bool | None = False) -> list[Item]:
    """Every transcoder under `path`: a sae-lens folder, a folder of sae-lens folders (one per layer),
    a circuit-tracer config.yaml or its folder, or a list of any of these (`lazy`: W_enc and W_dec mapped)."""
    if isinstance(path, (list, tuple)):
        if not path:
            raise ValueError("load_transcoders: path=[]: expected at least one folder or config file")
        return [item for p in path for item in read_transcoder_files(p, device, lazy)]
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"load_transcoders: path: expected a folder, a config file or a list of them, got {type(path).__name__}"
        )
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix in (".yaml", ".yml"):
            return read_circuit_tracer(p, device, lazy)
        if p.name == CFG_FILENAME:
            return [read_saelens_folder(p.parent, device, lazy)]
        raise ValueError(
            f"load_transcoders: path={str(p)!r}: expected a circuit-tracer {CT_CONFIG_FILENAME}, a sae-lens "
            f"{CFG_FILENAME} or a folder holding one (a layer's .safetensors alone does not say its hooks)"
        )
    if not p.is_dir():
        raise FileNotFoundError(f"load_transcoders: path={str(p)!r}: no such file or folder")
    if (p / CFG_FILENAME).is_file():
        return [read_saelens_folder(p, device, lazy)]
    if (p / CT_CONFIG_FILENAME).is_file():
        return read_circuit_tracer(p / CT_CONFIG_FILENAME, device, lazy)
    subs = sorted(q for q in p.iterdir() if (q / CFG_FILENAME).is_file())
    if not subs:
        there = sorted(q.name for q in p.iterdir())[:10]
        raise FileNotFoundError(
            f"load_transcoders: {str(p)!r} holds no {CFG_FILENAME} (sae-lens), no {CT_CONFIG_FILENAME} "
            f"(circuit-tracer) and no sub-folder with a {CFG_FILENAME} (it holds: {', '.join(there) or 'nothing'})"
        )
    return [read_saelens_folder(q, device, lazy) for q in subs]


def write_transcoder_set(items: list[Item], target: Path, format: str) -> Path:
    """Write a set of transcoders as one folder, whole or not at all (see save_transcoders)."""
    if format == "circuit-tracer":
        config = _ct_ready(items)
    else:
        for cfg, state in items:
            _saelens_ready(cfg, state, f"the transcoder of layer {cfg.layer}")
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"path: {str(target)!r} is a file; expected a folder to save the transcoders in")
    check_replaceable(target, "plt")  # only a per-layer set is replaced, by what its files say
    with atomic_folder(target) as tmp:
        _write_into(tmp, items, format, config if format == "circuit-tracer" else None)
    return target


def _write_into(folder: Path, items: list[Item], format: str, config: dict[str, Any] | None) -> None:
    if format == "saelens":
        for cfg, state in items:
            write_saelens_folder(folder / f"layer_{cfg.layer}", cfg, state)
        return
    import yaml

    assert config is not None
    for cfg, state in items:
        out = {k: v for k, v in state.items() if k not in ("W_enc", "threshold")}
        out["W_enc"] = state["W_enc"].T  # sae-lens' [d_in, d_sae] -> circuit-tracer's [d_sae, d_in]
        if "threshold" in state:
            out[_CT_THRESHOLD] = state["threshold"]
        if cfg.architecture == "topk":  # circuit-tracer 0.5.0 refuses the file rather than reading a ReLU
            out["k"] = torch.tensor(cfg.k, dtype=torch.int64)
        save_safetensors(folder / f"layer_{cfg.layer}.safetensors", out, {})
    with atomic_path(folder / CT_CONFIG_FILENAME) as t:  # written last: circuit-tracer's "complete" mark
        t.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
