"""Load GPT-2 checkpoints into `GPT`, and process weights as transformer-lens does.

Sources (`from_pretrained(source)`):
  * a hub id: "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", or any
    GPT-2-architecture repo, fetched through huggingface_hub and its cache;
  * a local folder: config.json + model.safetensors (or sharded safetensors, or pytorch_model.bin);
  * a single weights file (.safetensors, or .bin/.pt/.pth read with weights_only=True);
  * a `transformers` GPT2LMHeadModel / GPT2Model object;
  * a transformer-lens HookedTransformer (3.x) or TransformerBridge (4.x), or a state dict
    in either layout.

Nothing here unpickles arbitrary code: `.bin` files load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import einops
import torch
from torch import Tensor

from .config import Config
from .model import GPT

HUB_PRESETS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")
# Models shipped inside the package, loadable by folder name with no network.
SHIPPED_DIR = Path(__file__).resolve().parent / "weights"


def shipped_models() -> dict[str, Path]:
    """The models shipped in the package: name -> folder."""
    if not SHIPPED_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(SHIPPED_DIR.iterdir()) if (p / "config.json").is_file()}


def resolve_shipped(source: Any) -> Any:
    """A shipped model's name -> its folder; any other source unchanged."""
    return shipped_models().get(source, source) if isinstance(source, str) else source


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# Buffers Hugging Face's GPT-2 stores in older checkpoints; they hold no weights.
_HF_BUFFER = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")


class CheckpointError(ValueError):
    """A checkpoint whose tensors or config do not fit a GPT-2."""


# ----------------------------------------------------------------------------
# Reading sources
# ----------------------------------------------------------------------------
def _read_weights_file(path: Path) -> tuple[dict[str, Tensor], list[Path]]:
    """A weights file's tensors, and the files they came from.

    safetensors files are memory-mapped privately (copy-on-write), as Hugging Face reads
    them: a page of the file is read when first used, and writing a tensor changes only
    this process's copy, never the file.
    """
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path)), [path]
    if path.suffix == ".json":  # sharded safetensors index
        index = json.loads(path.read_text())
        out: dict[str, Tensor] = {}
        files: list[Path] = []
        for shard in sorted(set(index["weight_map"].values())):
            tensors, read = _read_weights_file(path.parent / shard)
            out.update(tensors)
            files += read
        return out, files
    if path.suffix in (".bin", ".pt", ".pth"):
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # an unpickling error names the forbidden global
            raise CheckpointError(
                f"{path}: could not be read with torch.load(weights_only=True) ({type(e).__name__}: {e}); "
                "interp_gpt never unpickles arbitrary objects: convert the checkpoint to safetensors"
            ) from e
        if isinstance(sd, Mapping) and "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
            sd = sd["state_dict"]
        if not isinstance(sd, Mapping):
            raise CheckpointError(f"{path}: expected a state dict (a mapping of tensors), got {type(sd).__name__}")
        return dict(sd), [path]
    raise CheckpointError(f"{path}: unknown weights format {path.suffix!r}; expected .safetensors, .bin, .pt or .pth")


def _read_folder(folder: Path) -> tuple[dict[str, Tensor], dict[str, Any] | None, list[Path]]:
    for name in _WEIGHT_FILES:
        if (folder / name).exists():
            weights, files = _read_weights_file(folder / name)
            break
    else:
        shards = sorted(folder.glob("model-*.safetensors"))
        if not shards:
            raise FileNotFoundError(f"{folder}: no weights found; expected one of {', '.join(_WEIGHT_FILES)}")
        weights, files = {}, []
        for shard in shards:
            tensors, read = _read_weights_file(shard)
            weights.update(tensors)
            files += read
    config_path = folder / "config.json"
    hf_config = json.loads(config_path.read_text()) if config_path.exists() else None
    return weights, hf_config, files


class _FileReader:
    """Single tensors of the safetensors files a load read, each through a map of its own that
    is dropped with the tensor: what is copied out of the file this way is never left resident
    twice (the load's own map keeps every page it has touched until the model is freed)."""

    def __init__(self, files: list[Path]) -> None:
        # The files as they were read: a file replaced since then is refused, not mixed in.
        self.files = {f: _identity(f) for f in files if f.suffix == ".safetensors"}

    def _find(self, key: str) -> tuple[Path, str] | None:
        from safetensors import safe_open

        for f, identity in self.files.items():
            if _identity(f) != identity:
                raise CheckpointError(f"{f}: the file changed while it was being loaded; load it again")
            with safe_open(str(f), framework="pt") as h:
                name = next((n for n in (key, "transformer." + key) if n in h.keys()), None)
            if name is not None:
                return f, name
        return None

    def get(self, key: str) -> Tensor | None:
        """The tensor (None if no file holds it), mapped until it is freed."""
        from safetensors import safe_open

        if (found := self._find(key)) is None:
            return None
        with safe_open(str(found[0]), framework="pt") as h:
            return h.get_tensor(found[1])

    def transposed(self, key: str) -> Tensor | None:
        """The transpose of a [rows, cols] tensor as a new contiguous tensor, read _PROCESS_CHUNK
        rows at a time: for W_U, GPT-2's lm_head (or the wte it is tied to)."""
        from safetensors import safe_open

        if (found := self._find(key)) is None:
            return None
        with safe_open(str(found[0]), framework="pt") as h:
            rows, cols = h.get_slice(found[1]).get_shape()
            out = torch.empty(cols, rows, dtype=h.get_slice(found[1])[:1].dtype)
        for i in range(0, rows, _PROCESS_CHUNK):
            if _identity(found[0]) != self.files[found[0]]:
                raise CheckpointError(f"{found[0]}: the file changed while it was being loaded; load it again")
            with safe_open(str(found[0]), framework="pt") as h:
                out[:, i : i + _PROCESS_CHUNK] = h.get_slice(found[1])[i : i + _PROCESS_CHUNK].T
        return out


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _looks_like_path(s: str) -> bool:
    """A string that names a file or folder rather than a hub id ("owner/name" has one slash)."""
    return (
        s.startswith((".", "/", "~"))
        or s.count("/") > 1
        or s.endswith((".safetensors", ".bin", ".pt", ".pth", ".json"))
    )


def _download(repo_id: str) -> Path:
    """Fetch a GPT-2 repo's config, weights and tokenizer files through the hub cache."""
    from huggingface_hub import hf_hub_download, snapshot_download

    patterns = [
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "model-*.safetensors",
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
    ]
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=patterns))
        if not any((folder / f).exists() for f in _WEIGHT_FILES[:2]) and not list(folder.glob("model-*.safetensors")):
            hf_hub_download(repo_id, "pytorch_model.bin")  # old repos without safetensors
            folder = Path(snapshot_download(repo_id, allow_patterns=patterns + ["pytorch_model.bin"]))
    except Exception as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
        why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else f"{type(e).__name__}: {e}"
        known = (
            ""
            if "/" in repo_id
            else (f" Known names: {', '.join(list(shipped_models()) + list(HUB_PRESETS))} (shipped ones load offline).")
        )
        raise OSError(
            f"could not load {repo_id!r} from the Hugging Face hub ({why}).{known} "
            "Or point at a local copy: a folder with config.json and model.safetensors "
            "(e.g. one saved by transformers' save_pretrained), or a weights file."
        ) from e
    return folder


# ----------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------
def config_from_hf(hf: Mapping[str, Any], name: str = "custom") -> Config:
    """A `Config` from a Hugging Face GPT-2 `config.json` (any size, not only the presets)."""
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    if model_type != "gpt2" and not any(str(a).startswith("GPT2") for a in archs):
        raise CheckpointError(
            f"config.json: model_type={model_type!r}, architectures={archs}: not a GPT-2 checkpoint "
            "(interp_gpt loads model_type 'gpt2' only)"
        )
    # Variants of GPT-2's attention we do not implement: refuse rather than compute wrongly.
    for key, plain in (("scale_attn_by_inverse_layer_idx", False), ("scale_attn_weights", True)):
        if bool(hf.get(key, plain)) != plain:
            raise CheckpointError(
                f"config.json: {key}={hf[key]!r} is not supported (GPT-2 uses {plain}); "
                "its attention scaling differs from GPT-2's"
            )
    try:
        d_model, n_heads = int(hf["n_embd"]), int(hf["n_head"])
        act = hf.get("activation_function", "gelu_new")
        act = "gelu_new" if act == "gelu_pytorch_tanh" else act  # the same function
        return Config(
            n_layers=int(hf["n_layer"]),
            d_model=d_model,
            n_heads=n_heads,
            d_head=d_model // n_heads,
            d_mlp=int(hf.get("n_inner") or 4 * d_model),
            d_vocab=int(hf["vocab_size"]),
            n_ctx=int(hf.get("n_positions") or hf.get("n_ctx")),
            act_fn=act,
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            init_range=float(hf.get("initializer_range", 0.02)),
            model_name=name,
        )
    except KeyError as e:
        raise CheckpointError(f"config.json: missing GPT-2 field {e.args[0]!r}") from e


def _config_from_hf_tensors(sd: Mapping[str, Tensor], name: str) -> Config:
    """Infer a config from GPT-2 tensors alone (no config.json): GPT-2 always has d_head 64."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    if "wte.weight" not in sd:
        raise CheckpointError(f"{name}: no 'wte.weight' tensor: not a GPT-2 state dict (keys: {sorted(sd)[:8]} ...)")
    d_vocab, d_model = sd["wte.weight"].shape
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"h\.(\d+)\.", k))}
    if d_model % 64:
        raise CheckpointError(
            f"{name}: d_model={d_model} is not a multiple of 64; pass config= (n_heads cannot be inferred)"
        )
    return Config(
        n_layers=len(layers),
        d_model=d_model,
        n_heads=d_model // 64,
        d_vocab=d_vocab,
        n_ctx=sd["wpe.weight"].shape[0],
        d_mlp=sd["h.0.mlp.c_fc.weight"].shape[1] if layers else 4 * d_model,
        model_name=name,
    )


def _config_from_tl_state_dict(sd: Mapping[str, Tensor], name: str) -> Config:
    needed = ["embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q", "blocks.0.mlp.W_in"]
    _raise_if_bad(name, [k for k in needed if k not in sd], [], [])
    d_vocab, d_model = sd["embed.W_E"].shape
    n_heads, _, d_head = sd["blocks.0.attn.W_Q"].shape
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))}
    return Config(
        n_layers=len(layers),
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=sd["blocks.0.mlp.W_in"].shape[1],
        d_vocab=d_vocab,
        n_ctx=sd["pos_embed.W_pos"].shape[0],
        normalization_type="LN" if "blocks.0.ln1.w" in sd else "LNPre",
        model_name=name,
    )


def _config_from_tl_cfg(tl_cfg: Any) -> Config:
    checks = {
        "positional_embedding_type": "standard",
        "attn_only": False,
        "parallel_attn_mlp": False,
        "final_rms": False,
        "gated_mlp": False,
    }
    for attr, want in checks.items():
        got = getattr(tl_cfg, attr, want)
        if got != want:
            raise CheckpointError(f"transformer-lens model: cfg.{attr}={got!r}, a GPT-2 has {want!r}")
    if tl_cfg.normalization_type not in ("LN", "LNPre"):
        raise CheckpointError(
            f"transformer-lens model: normalization_type={tl_cfg.normalization_type!r}, expected 'LN' or 'LNPre'"
        )
    return Config(
        n_layers=tl_cfg.n_layers,
        d_model=tl_cfg.d_model,
        n_heads=tl_cfg.n_heads,
        d_head=tl_cfg.d_head,
        d_mlp=tl_cfg.d_mlp,
        d_vocab=tl_cfg.d_vocab,
        n_ctx=tl_cfg.n_ctx,
        act_fn=tl_cfg.act_fn,
        layer_norm_eps=tl_cfg.eps,
        normalization_type=tl_cfg.normalization_type,
        model_name=getattr(tl_cfg, "model_name", "custom"),
    )


# ----------------------------------------------------------------------------
# Hugging Face layout -> ours
# ----------------------------------------------------------------------------
def convert_hf_gpt2_state_dict(
    hf_sd: Mapping[str, Tensor],
    cfg: Config,
    *,
    owned: bool = False,
    reader: _FileReader | None = None,
) -> dict[str, Tensor]:
    """Rename and reshape a Hugging Face GPT-2 state dict into ours (= transformer-lens').

    GPT-2 stores c_attn, c_proj and c_fc as Conv1D, whose weight is [in, out]: the
    transpose of nn.Linear's. That is the layout our W matrices use, so they are
    only split per head, never transposed. lm_head is an nn.Linear ([d_vocab, d_model]),
    so W_U is its transpose. Every result is contiguous.

    `owned`: the tensors are the caller's to give away (freshly read from a file), so the
    result may be them; otherwise every result is a copy, and editing the loaded model never
    edits the source. W_U never shares memory with W_E: GPT-2 ties them, and a tied copy
    would make an edit of one an edit of both. With a `reader` of the files the tensors were
    read from, the two tensors that must be copied (c_attn, split into W_Q/W_K/W_V, and W_U)
    are copied out of maps of their own, so the file's pages are not also left resident.
    """
    sd = {k.removeprefix("transformer."): v for k, v in hf_sd.items() if not _HF_BUFFER.search(k)}
    h, dh, d, dm, V = cfg.n_heads, cfg.d_head, cfg.d_model, cfg.d_mlp, cfg.d_vocab
    missing: list[str] = []
    misshaped: list[str] = []

    def take(key: str, shape: tuple[int, ...]) -> Tensor:
        t = sd.pop(key, None)
        if t is None:
            missing.append(key)
            return torch.zeros(shape)
        if tuple(t.shape) != shape:
            misshaped.append(f"{key}: {tuple(t.shape)}, expected {shape}")
            return torch.zeros(shape)
        return t.detach() if owned else t.detach().clone()

    out: dict[str, Tensor] = {
        "embed.W_E": take("wte.weight", (V, d)),
        "pos_embed.W_pos": take("wpe.weight", (cfg.n_ctx, d)),
    }
    for L in range(cfg.n_layers):
        p, q = f"h.{L}.", f"blocks.{L}."
        out[q + "ln1.w"], out[q + "ln1.b"] = take(p + "ln_1.weight", (d,)), take(p + "ln_1.bias", (d,))
        # [d_model, q|k|v]; split per head, so copied (contiguous), from a map of its own if it can
        W_qkv = take(p + "attn.c_attn.weight", (d, 3 * h * dh))
        if owned and reader is not None and (mapped := reader.get(p + "attn.c_attn.weight")) is not None:
            W_qkv = mapped if mapped.shape == W_qkv.shape else W_qkv
        b_qkv = take(p + "attn.c_attn.bias", (3 * h * dh,))
        for X, W, b in zip("QKV", W_qkv.split(h * dh, dim=1), b_qkv.split(h * dh), strict=True):
            W = einops.rearrange(W, "d_model (n_heads d_head) -> n_heads d_model d_head", n_heads=h)
            out[q + f"attn.W_{X}"] = W.clone(memory_format=torch.contiguous_format)
            out[q + f"attn.b_{X}"] = einops.rearrange(b, "(n_heads d_head) -> n_heads d_head", n_heads=h).clone()
        del W_qkv
        W_O = take(p + "attn.c_proj.weight", (h * dh, d))
        out[q + "attn.W_O"] = einops.rearrange(W_O, "(n_heads d_head) d_model -> n_heads d_head d_model", n_heads=h)
        out[q + "attn.b_O"] = take(p + "attn.c_proj.bias", (d,))
        out[q + "ln2.w"], out[q + "ln2.b"] = take(p + "ln_2.weight", (d,)), take(p + "ln_2.bias", (d,))
        out[q + "mlp.W_in"], out[q + "mlp.b_in"] = (
            take(p + "mlp.c_fc.weight", (d, dm)),
            take(p + "mlp.c_fc.bias", (dm,)),
        )
        out[q + "mlp.W_out"], out[q + "mlp.b_out"] = (
            take(p + "mlp.c_proj.weight", (dm, d)),
            take(p + "mlp.c_proj.bias", (d,)),
        )
    out["ln_final.w"], out["ln_final.b"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    lm_head = sd.pop("lm_head.weight", None)  # GPT-2 ties it to wte; checkpoints often omit it
    W_E = out["embed.W_E"]
    if lm_head is not None and tuple(lm_head.shape) != (V, d):
        misshaped.append(f"lm_head.weight: {tuple(lm_head.shape)}, expected {(V, d)}")
    else:
        source = "lm_head.weight" if lm_head is not None else "wte.weight"
        W_U = reader.transposed(source) if (owned and reader is not None) else None
        if W_U is None or tuple(W_U.shape) != (d, V):
            W_U = (W_E if lm_head is None else lm_head.detach()).T.clone(memory_format=torch.contiguous_format)
        out["unembed.W_U"] = W_U
    out["unembed.b_U"] = torch.zeros(V, dtype=W_E.dtype)
    _raise_if_bad(cfg.model_name, missing, sorted(sd), misshaped)
    return out


def convert_to_hf_gpt2_state_dict(model: GPT) -> dict[str, Tensor]:
    """Our (unprocessed) weights in Hugging Face GPT-2's layout: the inverse of the above."""
    if model.cfg.normalization_type != "LN":
        raise ValueError(
            "convert_to_hf_gpt2_state_dict: the model's LayerNorm weights were folded; load it with from_pretrained_no_processing"
        )
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    b_U = sd["unembed.b_U"]
    if not bool((b_U == b_U[0]).all()):
        raise ValueError(
            "convert_to_hf_gpt2_state_dict: unembed.b_U is not constant, and Hugging Face's GPT-2 "
            "lm_head has no bias: saving would change the logits"
        )
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    for L in range(model.cfg.n_layers):
        p, q = f"transformer.h.{L}.", f"blocks.{L}."
        out[p + "ln_1.weight"], out[p + "ln_1.bias"] = sd[q + "ln1.w"], sd[q + "ln1.b"]
        out[p + "attn.c_attn.weight"] = torch.cat(
            [
                einops.rearrange(sd[q + f"attn.W_{X}"], "n_heads d_model d_head -> d_model (n_heads d_head)")
                for X in "QKV"
            ],
            dim=1,
        )
        out[p + "attn.c_attn.bias"] = torch.cat([sd[q + f"attn.b_{X}"].flatten() for X in "QKV"])
        out[p + "attn.c_proj.weight"] = einops.rearrange(
            sd[q + "attn.W_O"], "n_heads d_head d_model -> (n_heads d_head) d_model"
        )
        out[p + "attn.c_proj.bias"] = sd[q + "attn.b_O"]
        out[p + "ln_2.weight"], out[p + "ln_2.bias"] = sd[q + "ln2.w"], sd[q + "ln2.b"]
        out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = sd[q + "mlp.W_in"], sd[q + "mlp.b_in"]
        out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = sd[q + "mlp.W_out"], sd[q + "mlp.b_out"]
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_final.w"], sd["ln_final.b"]
    out["lm_head.weight"] = sd["unembed.W_U"].T
    return {k: v.contiguous().clone() for k, v in out.items()}


def save_hf_checkpoint(model: GPT, folder: str | os.PathLike) -> Path:
    """Save as a Hugging Face GPT-2 folder (config.json + model.safetensors) that
    `transformers.GPT2LMHeadModel.from_pretrained` and `from_pretrained` here both read."""
    from safetensors.torch import save_file

    cfg = model.cfg
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        raise ValueError("save_hf_checkpoint: Hugging Face GPT-2 needs n_heads * d_head == d_model")
    tensors = convert_to_hf_gpt2_state_dict(model)  # raises for a model it cannot save: before any write
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # GPT-2's end-of-text id, or the model's own tokenizer's (a small vocabulary has no 50256).
    tok = model.tokenizer
    bos, eos = (tok.bos_token_id, tok.eos_token_id) if tok is not None else (50256, 50256)
    if max(bos, eos) >= cfg.d_vocab:
        bos = eos = cfg.d_vocab - 1
    hf_config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": cfg.n_layers,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_mlp,
        "vocab_size": cfg.d_vocab,
        "n_positions": cfg.n_ctx,
        "n_ctx": cfg.n_ctx,
        "activation_function": cfg.act_fn,
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_range": cfg.init_range,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
    # A new file renamed over the old one, never the old file rewritten: a model loaded from
    # it maps its pages (see _read_weights_file) and must keep the weights it was loaded with.
    tmp = folder / f".model.safetensors.{os.getpid()}.tmp"
    try:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / "model.safetensors")
    finally:
        tmp.unlink(missing_ok=True)
    return folder


def _raise_if_bad(name: str, missing: list[str], unexpected: list[str], misshaped: list[str]) -> None:
    if not (missing or unexpected or misshaped):
        return
    lines = [f"checkpoint {name!r} does not fit the model:"]
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
        if items:
            shown = items[:10] + ([f"... ({len(items)} in all)"] if len(items) > 10 else [])
            lines.append(f"  {label} tensors: " + ", ".join(shown))
    raise CheckpointError("\n".join(lines))


# ----------------------------------------------------------------------------
# Weight processing (transformer-lens' defaults)
# ----------------------------------------------------------------------------
# Each step edits the tensors of `sd` in place and does its work on whatever part of the
# model `sd` holds (a layer, the embeddings, the unembedding), so that process_weights can
# take the model one part at a time and hold only that part in float64.
def _layers_in(sd: Mapping[str, Tensor], cfg: Config) -> list[int]:
    return [L for L in range(cfg.n_layers) if any(k.startswith(f"blocks.{L}.") for k in sd)]


def fold_layer_norm(sd: dict[str, Tensor], cfg: Config, center_weights: bool = True) -> None:
    """Fold each LayerNorm's weight and bias into the layer that reads its output.

    LN(x) @ W + b_W  ==  LNPre(x) @ (w[:, None] * W) + (b @ W + b_W), so after this the
    LayerNorms only centre and scale (the caller sets cfg to "LNPre"). With `center_weights`
    the reading weights are also centred along d_model: LNPre's output has zero mean, so a
    constant added along that axis changes nothing.
    """

    def fold(ln: str, readers: list[tuple[str, str]], d_model_axis: int) -> None:
        if f"{ln}.w" not in sd:
            return
        w, b = sd.pop(f"{ln}.w"), sd.pop(f"{ln}.b")
        shape = [1] * sd[readers[0][0]].ndim
        shape[d_model_axis] = -1
        for W_key, b_key in readers:
            W = sd[W_key]
            sd[b_key] += torch.tensordot(b, W, dims=([0], [d_model_axis]))  # b @ W along d_model
            W.mul_(w.reshape(shape))
            if center_weights:
                W.sub_(W.mean(d_model_axis, keepdim=True))

    for L in _layers_in(sd, cfg):
        q = f"blocks.{L}."
        fold(q + "ln1", [(q + f"attn.W_{X}", q + f"attn.b_{X}") for X in "QKV"], d_model_axis=1)
        fold(q + "ln2", [(q + "mlp.W_in", q + "mlp.b_in")], d_model_axis=0)
    fold("ln_final", [("unembed.W_U", "unembed.b_U")], d_model_axis=0)


def center_writing_weights(sd: dict[str, Tensor], cfg: Config) -> None:
    """Make everything that writes to the residual stream write mean-zero vectors.

    Every reader of the residual stream starts with a LayerNorm that subtracts the
    mean, so removing it at the source changes no output.
    """
    for key in ["embed.W_E", "pos_embed.W_pos"] + [
        f"blocks.{L}.{m}" for L in range(cfg.n_layers) for m in ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")
    ]:
        if key in sd:
            sd[key].sub_(sd[key].mean(-1, keepdim=True))


def center_unembed(sd: dict[str, Tensor]) -> None:
    """Subtract each position's mean logit (softmax is unchanged by a shift)."""
    if "unembed.W_U" in sd:
        sd["unembed.W_U"].sub_(sd["unembed.W_U"].mean(-1, keepdim=True))
        sd["unembed.b_U"].sub_(sd["unembed.b_U"].mean())


def fold_value_biases(sd: dict[str, Tensor], cfg: Config) -> None:
    """Move b_V into b_O: each pattern row sums to 1, so sum_k p_k (v_k + b_V) W_O = ... + b_V W_O."""
    for L in _layers_in(sd, cfg):
        q = f"blocks.{L}.attn."
        sd[q + "b_O"] += einops.einsum(
            sd[q + "b_V"], sd[q + "W_O"], "n_heads d_head, n_heads d_head d_model -> d_model"
        )
        sd[q + "b_V"].zero_()


# process_weights' flags share these functions' names.
_center_writing_weights, _center_unembed, _fold_value_biases = center_writing_weights, center_unembed, fold_value_biases


def process_weights(
    sd: dict[str, Tensor],
    cfg: Config,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
    *,
    inplace: bool = False,
) -> dict[str, Tensor]:
    """Apply transformer-lens' default processing, in its order, computing in float64.

    Works on the dict `sd` in place and returns it. One piece of the model at a time (a
    layer; 4,096 rows of W_E; 4,096 columns of W_U with ln_final) is copied to float64 and
    processed, so no more than a layer's float64 copy exists at once (for GPT-2 small 57 MB,
    not the 309 MB of its unembedding); every step acts on each row, column or layer alone,
    so this equals running each step over the whole model in turn. The one exception,
    center_unembed's mean over the vocabulary, is summed in a first pass over W_U. The
    results replace the dict's entries in their own dtype, or with `inplace=True` are
    written into the tensors `sd` holds (no new memory; only for tensors that are the
    caller's to change, as from_pretrained's are). With every flag off it changes nothing.
    """
    if not (fold_ln or center_writing_weights or center_unembed or fold_value_biases):
        return sd
    if fold_ln and cfg.normalization_type not in ("LN", "LNPre"):
        raise ValueError(f"fold_ln: cannot fold normalization_type={cfg.normalization_type!r}")
    fold = fold_ln and cfg.normalization_type == "LN"

    # A piece: (key, index) pairs, where index picks the rows or columns of sd[key] it holds.
    Piece = list[tuple[str, tuple[slice, ...]]]
    whole = (slice(None),)
    chunk = _PROCESS_CHUNK
    pieces: list[Piece] = [[(k, whole) for k in sd if k.startswith(f"blocks.{L}.")] for L in range(cfg.n_layers)]
    pieces.append([(k, whole) for k in sd if k.startswith("pos_embed.")])
    if "embed.W_E" in sd:
        pieces += [[("embed.W_E", (slice(i, i + chunk),))] for i in range(0, sd["embed.W_E"].shape[0], chunk)]
    rest = [k for k in sd if not k.startswith(("blocks.", "embed.", "pos_embed."))]  # ln_final, unembed
    unembed_pieces: list[Piece] = []
    if "unembed.W_U" in sd and "unembed.b_U" in sd:
        others = [(k, whole) for k in rest if k not in ("unembed.W_U", "unembed.b_U")]
        for i in range(0, sd["unembed.W_U"].shape[1], chunk):
            cols = slice(i, i + chunk)
            unembed_pieces.append(others + [("unembed.W_U", (slice(None), cols)), ("unembed.b_U", (cols,))])
    elif rest:
        pieces.append([(k, whole) for k in rest])

    # One float64 buffer, the size of the largest piece, holds each piece in turn: fresh memory
    # is paid for once, not once per piece (on a VM, first-touching a page is what costs).
    scratch = torch.empty(
        max(sum(sd[k][i].numel() for k, i in p) for p in pieces + unembed_pieces), dtype=torch.float64
    )

    def processed(piece: Piece) -> dict[str, Tensor]:
        part, used = {}, 0
        for k, i in piece:
            src = sd[k][i]
            part[k] = scratch[used : used + src.numel()].view(src.shape).copy_(src)
            used += src.numel()
        if fold:
            fold_layer_norm(part, cfg)
        if center_writing_weights:
            _center_writing_weights(part, cfg)
        if fold_value_biases:
            _fold_value_biases(part, cfg)
        return part

    results: dict[str, Tensor] = {}  # inplace=False: the new tensors, filled piece by piece
    folded: set[str] = set()

    def store(piece: Piece, part: dict[str, Tensor]) -> None:
        for k, i in piece:
            if k not in part:  # a LayerNorm folded away
                folded.add(k)
                continue
            if not inplace and k not in results:
                results[k] = torch.empty_like(sd[k])
            (sd[k] if inplace else results[k])[i].copy_(part[k])

    for piece in pieces:
        part = processed(piece)
        if center_unembed:  # an unembedding that came whole
            _center_unembed(part)
        store(piece, part)
    if unembed_pieces:
        mean_W = mean_b = None
        if center_unembed:  # first pass: the mean over the vocabulary of the processed W_U and b_U
            sum_W = torch.zeros(sd["unembed.W_U"].shape[0], dtype=torch.float64)
            sum_b = torch.zeros((), dtype=torch.float64)
            for piece in unembed_pieces:
                part = processed(piece)
                sum_W += part["unembed.W_U"].sum(-1)
                sum_b += part["unembed.b_U"].sum()
            mean_W, mean_b = sum_W / sd["unembed.W_U"].shape[1], sum_b / sd["unembed.b_U"].shape[0]
        for piece in unembed_pieces:
            part = processed(piece)
            if mean_W is not None:
                part["unembed.W_U"].sub_(mean_W[:, None])
                part["unembed.b_U"].sub_(mean_b)
            store(piece, part)
    for k in folded:
        del sd[k]
    sd.update(results)
    if fold:
        cfg.normalization_type = "LNPre"
    return sd


# process_weights holds this many rows of W_E, or columns of W_U, in float64 at once.
_PROCESS_CHUNK = 4096


# ----------------------------------------------------------------------------
# The entry points
# ----------------------------------------------------------------------------
def load_source(source: Any, config: Config | None = None) -> tuple[Config, dict[str, Tensor], Path | None]:
    """Read any supported source into (config, our state dict, folder with tokenizer files or None).

    The state dict's tensors are the caller's to edit in place: weights read from a file
    (private memory maps, see _read_weights_file) or copies, never the memory of a model
    object or state dict passed in.
    """
    folder: Path | None = None
    files: list[Path] = []
    hf_config: Mapping[str, Any] | None = None
    name = "custom"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        name = str(source)
        if path.is_dir():
            folder = path
            weights, hf_config, files = _read_folder(path)
        elif path.is_file():
            weights, files = _read_weights_file(path)
            cfg_path = path.parent / "config.json"
            hf_config = json.loads(cfg_path.read_text()) if cfg_path.exists() and path.suffix != ".json" else None
            folder = path.parent
        elif isinstance(source, str) and source in shipped_models():
            folder = shipped_models()[source]
            weights, hf_config, files = _read_folder(folder)
        elif isinstance(source, str) and not _looks_like_path(source):
            folder = _download(source)
            weights, hf_config, files = _read_folder(folder)
        else:
            raise FileNotFoundError(f"source: no file or folder at {str(source)!r}")
    elif hasattr(source, "cfg") and hasattr(source, "tl_parameters"):  # transformer-lens 4.x TransformerBridge
        # Its own state dict is in HF's layout; tl_parameters() is the TL-layout view. After
        # processing it keeps LN weights of 1 and biases of 0, which compute the same as LNPre.
        cfg = _config_from_tl_cfg(source.cfg)
        return cfg, _tl_state_dict({k: v.detach() for k, v in source.tl_parameters().items()}, cfg), None
    elif hasattr(source, "config") and hasattr(source, "state_dict") and hasattr(source.config, "to_dict"):
        hf_config = source.config.to_dict()  # a transformers model
        name = getattr(source.config, "_name_or_path", None) or "transformers-model"
        weights = source.state_dict()
    elif hasattr(source, "cfg") and hasattr(source, "state_dict"):  # a transformer-lens HookedTransformer
        cfg = _config_from_tl_cfg(source.cfg)
        return cfg, _tl_state_dict(source.state_dict(), cfg), None
    elif isinstance(source, Mapping):
        weights = dict(source)
    else:
        raise TypeError(
            "source: expected a hub id, a path, a transformers GPT-2 model, a transformer-lens model "
            f"or a state dict; got {type(source).__name__}"
        )

    if "embed.W_E" in weights:  # already in transformer-lens' layout
        cfg = dataclasses.replace(config) if config else _config_from_tl_state_dict(weights, name)
        return cfg, _tl_state_dict(weights, cfg), folder
    if config is not None:
        cfg = dataclasses.replace(config)  # processing edits cfg; never the caller's
    elif hf_config is not None:
        cfg = config_from_hf(hf_config, name)
    else:
        cfg = _config_from_hf_tensors(weights, name)
    cfg.model_name = name if cfg.model_name == "custom" else cfg.model_name
    # Tensors read from a file are ours alone (files is empty for every other source).
    return cfg, convert_hf_gpt2_state_dict(weights, cfg, owned=bool(files), reader=_FileReader(files)), folder


def _tl_state_dict(sd: Mapping[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """Check a transformer-lens layout state dict against cfg; drop its non-weight buffers."""
    sd = {k: v for k, v in sd.items() if not re.search(r"\.attn\.(IGNORE|mask)$", k)}
    expected = _expected_shapes(cfg)
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    misshaped = [
        f"{k}: {tuple(sd[k].shape)}, expected {s}" for k, s in expected.items() if k in sd and tuple(sd[k].shape) != s
    ]
    _raise_if_bad(cfg.model_name, missing, unexpected, misshaped)
    return {k: v.detach().clone() for k, v in sd.items()}


def _expected_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in GPT(cfg).named_parameters()}


def from_pretrained(
    source: Any,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    config: Config | None = None,
    tokenizer: Any = "auto",
) -> GPT:
    """Load a GPT-2 checkpoint, processed like transformer-lens' `from_pretrained` by default.

    `center_unembed` shifts every logit of a row by the same amount: compare processed
    models by log-probs. `tokenizer="auto"` attaches the checkpoint's own tokenizer files
    if it has them, else GPT-2's BPE (for a 50,257-token vocabulary); pass a `Tokenizer`
    or None to choose.

    Weights in .safetensors files are memory-mapped copy-on-write, as Hugging Face reads
    them: loading reads only W_U and W_Q/W_K/W_V (copies: see convert_hf_gpt2_state_dict),
    every other page is read when first used, and editing a weight changes this model only,
    never the file. Replacing the file while the model lives
    is safe (save_hf_checkpoint writes a new file and renames it); rewriting it in place
    would change the weights the model has not used yet.

    Example:
        >>> model = from_pretrained("gpt2")                       # hub (or its cache)
        >>> model = from_pretrained("./ckpt", fold_ln=False)      # local folder
    """
    cfg, sd, folder = load_source(source, config)
    # load_source's tensors are ours alone: process them where they lie (no second copy).
    sd = process_weights(sd, cfg, fold_ln, center_writing_weights, center_unembed, fold_value_biases, inplace=True)
    with torch.device("meta"):
        model = GPT(cfg)
    expected = dict(model.named_parameters())
    _raise_if_bad(cfg.model_name, sorted(set(expected) - set(sd)), sorted(set(sd) - set(expected)), [])
    model.load_state_dict(sd, strict=False, assign=True)
    # Buffers were created on the meta device: rebuild them for real.
    for block in model.blocks:
        block.attn.IGNORE = torch.tensor(float("-inf"))
        block.attn.mask = torch.empty((0, 0), dtype=torch.bool)
    model = model.to(dtype=dtype, device=device)
    from_hub = isinstance(source, str) and not Path(source).expanduser().exists() and source not in shipped_models()
    model.tokenizer = (
        _auto_tokenizer(cfg, folder, from_hub) if isinstance(tokenizer, str) and tokenizer == "auto" else tokenizer
    )
    return model.eval()


def from_pretrained_no_processing(source: Any, **kwargs: Any) -> GPT:
    """Load a GPT-2 checkpoint with its weights exactly as stored."""
    flags = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    return from_pretrained(source, **{**flags, **kwargs})


def _auto_tokenizer(cfg: Config, folder: Path | None, from_hub: bool) -> Any:
    from .tokenizer import gpt2_tokenizer, saved_tokenizer

    if folder is not None and (saved := saved_tokenizer(folder)) is not None:
        return saved
    has_files = folder is not None and (
        (folder / "tokenizer.json").exists() or (folder / "vocab.json").exists() or (folder / "encoder.json").exists()
    )
    if not has_files and cfg.d_vocab != 50257:
        return None
    try:
        # A local checkpoint does not make us call the hub for a vocabulary.
        return gpt2_tokenizer(folder if has_files else None, allow_hub=from_hub)
    except OSError as e:
        warnings.warn(f"no tokenizer attached ({e}); the model still takes token ids", stacklevel=3)
        return None
