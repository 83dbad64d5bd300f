"""What SAEs (saes/) and transcoders (transcoders/, training/) share, written once: dtype names, sae-lens'
metadata and cfg.json conventions, the config field checks, the weights' dtype / device and the SAE hook
points, the checks of a weights file, the model-name comparison, the evaluation loop's CE losses and the
training commands' shared options. Each family keeps only what differs; this module imports neither.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..checkpoints.sources import CheckpointError, config_digest
from ..checks import BAD_INPUT, check_int_in_range, check_tokens, error_line
from ..cli.common import add_data_argument
from ..hooks import HookPoint

__all__ = [
    "parse_dtype", "dtype_name", "cast_state", "SAEMetadata", "FORMAT_VERSION", "PRE6_METADATA_KEYS", "is_6x",
    "from_pre_6", "saelens_cfg_dict", "with_saelens_versions", "saelens_cfg_json", "config_from_fields", "config_from_file",
    "coerce_metadata", "check_positive_ints", "check_bools", "check_strings", "ConfigDtype", "HOOK_NAMES", "identity",
    "NO_HOOKS", "hooks_of", "add_hook_points", "check_init_seed", "zero_if_present", "load_built", "CoderWeights",
    "CoderHookPoints", "CFG_FILENAME", "WEIGHTS_FILENAME", "DIGEST_KEY", "read_safetensors", "check_tensors",
    "check_digest", "removed_if_left_empty", "explained_variance",
    "check_eval_inputs", "zero_ablation", "ce_batches", "kl_divergence", "ce_metrics", "add_corpus_arguments", "add_feature_arguments", "add_run_arguments",
    "add_out_arguments", "config_from_options", "check_hooks", "start_training_run", "run_subcommand", "command_main",
]  # fmt: skip

# ----------------------------------------------------------------------------------------------
# dtypes
# ----------------------------------------------------------------------------------------------
_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
}


def parse_dtype(value: Any, arg: str = "dtype") -> torch.dtype:
    """A dtype from a torch.dtype or a name ("float32", "torch.bfloat16", ...)."""
    if isinstance(value, torch.dtype):
        if value.is_floating_point:
            return value
    elif isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
        return _DTYPES[value.removeprefix("torch.")]
    raise ValueError(f"{arg}={value!r} is not a float dtype; expected one of {', '.join(list(_DTYPES)[:4])}")


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name as cfg.json writes it ("float32")."""
    return str(dtype).removeprefix("torch.")


def cast_state(state: dict[str, Tensor], dtype: str | torch.dtype | None) -> tuple[dict[str, Tensor], str | None]:
    """`state` cast to `dtype` and the dtype's name; (state, None) unchanged when `dtype` is None."""
    if dtype is None:
        return state, None
    torch_dtype = parse_dtype(dtype)
    return {k: v.to(torch_dtype) for k, v in state.items()}, dtype_name(torch_dtype)


# ----------------------------------------------------------------------------------------------
# sae-lens' metadata and cfg.json
# ----------------------------------------------------------------------------------------------
class SAEMetadata(dict):  # type: ignore[type-arg]
    """What an SAE was trained on (model_name, hook_name, ...): a dict whose keys read as attributes,
    a missing one as None (as sae-lens' `SAEMetadata`).

    Example:
        >>> SAEMetadata(hook_name="blocks.1.hook_resid_pre").hook_name
        'blocks.1.hook_resid_pre'
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def to_dict(self) -> dict[str, Any]:
        """The metadata as a plain dict."""
        return dict(self)


# The cfg.json a 6.x sae-lens reads as its own layout needs a version >= 6 in metadata; without one it
# takes the file for a pre-6.0 one and rebuilds metadata from top-level keys (losing metadata.hook_name).
FORMAT_VERSION = "6.0.0"
# Keys sae-lens 6 moved from the top level of a pre-6.0 cfg.json into metadata.
PRE6_METADATA_KEYS = (
    "model_name",
    "hook_name",
    "model_class_name",
    "hook_head_index",
    "model_from_pretrained_kwargs",
    "prepend_bos",
    "exclude_special_tokens",
    "neuronpedia_id",
    "context_size",
    "seqpos_slice",
    "dataset_path",
    "sae_lens_version",
    "sae_lens_training_version",
    "hook_name_out",
    "hook_head_index_out",
    "hf_hook_name",
    "hf_hook_name_out",
)


def is_6x(version: Any) -> bool:
    """Whether a sae_lens_version string is 6.0 or later."""
    if not isinstance(version, str):
        return False
    head = version.split(".")[0]
    return head.isdigit() and int(head) >= 6


def from_pre_6(d: dict[str, Any]) -> dict[str, Any]:
    """sae-lens' handle_pre_6_0_config: rename old keys, infer the architecture, move metadata."""
    rename = {
        "hook_point": "hook_name",
        "hook_point_head_index": "hook_head_index",
        "activation_fn_str": "activation_fn",
    }
    new = {rename.get(k, k): v for k, v in d.items()}
    arch = new.get("architecture") or "standard"
    kwargs = new.get("activation_fn_kwargs") or {}
    if new.get("activation_fn") == "topk" and isinstance(kwargs, dict) and kwargs.get("k") is not None:
        arch, new["k"] = "topk", kwargs["k"]
    new["architecture"] = arch
    norm = new.get("normalize_activations")
    if isinstance(norm, bool) or norm is None:
        new["normalize_activations"] = "expected_average_only_in" if norm else "none"
    if "reshape_activations" not in new:
        new["reshape_activations"] = "hook_z" if "hook_z" in str(new.get("hook_name", "")) else "none"
    meta = dict(new.get("metadata") or {})
    meta.update({k: new[k] for k in PRE6_METADATA_KEYS if k in new})
    new["metadata"] = meta
    return new


def saelens_cfg_dict(d: Any, where: str) -> dict[str, Any]:
    """A cfg.json's contents checked to be an object (its metadata too), in sae-lens 6's layout (a
    pre-6.0 one converted as sae-lens does)."""
    if not isinstance(d, dict):
        raise TypeError(f"{where}: expected a JSON object, got {type(d).__name__}")
    meta_in = d.get("metadata")
    if meta_in is not None and not isinstance(meta_in, dict):
        raise ValueError(f"{where}: metadata must be an object, got {type(meta_in).__name__}")
    version = d.get("sae_lens_version") or (meta_in or {}).get("sae_lens_version")
    return d if is_6x(version) else from_pre_6(d)


def with_saelens_versions(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with sae_lens_version (and the training version) set unless it says them: a 6.x reader
    then takes the file for its own layout."""
    meta.setdefault("sae_lens_version", FORMAT_VERSION)
    meta.setdefault("sae_lens_training_version", meta["sae_lens_version"])
    return meta


def saelens_cfg_json(
    cfg: Any, architecture: str, fixed: dict[str, Any], extra: dict[str, Any], topk: dict[str, Any]
) -> dict[str, Any]:
    """The cfg.json sae-lens 6 writes for `cfg`: its widths, dtype, device and normalisation, `fixed`
    (apply_b_dec_to_input, reshape_activations) and `extra` fields, `topk`'s for a topk one, its
    metadata (with the sae-lens version) and `architecture`, in sae-lens' order."""
    out: dict[str, Any] = {"d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": cfg.dtype, "device": cfg.device}
    out["apply_b_dec_to_input"] = fixed["apply_b_dec_to_input"]
    out["normalize_activations"] = cfg.normalize_activations
    out["reshape_activations"] = fixed["reshape_activations"]
    out.update(extra)
    if cfg.architecture == "topk":
        out.update(topk)
    out["metadata"] = with_saelens_versions(cfg.metadata.to_dict())
    out["architecture"] = architecture
    return out


def config_from_fields(cls: Any, where: str, **kwargs: Any) -> Any:
    """`cls(**kwargs)`, its TypeError / ValueError raised again as a ValueError prefixed with `where`."""
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from e


def config_from_file(cls: Any, raw: Any, path: Path) -> Any:
    """`cls.from_dict` of a cfg.json's contents read from `path`, its errors raised as CheckpointError."""
    try:
        return cls.from_dict(raw, where=str(path))
    except (TypeError, ValueError) as e:
        raise CheckpointError(str(e)) from e


# ----------------------------------------------------------------------------------------------
# config field checks (each error names the field)
# ----------------------------------------------------------------------------------------------
def coerce_metadata(value: Any) -> SAEMetadata:
    """`metadata` as an SAEMetadata (a dict is converted; anything else refused)."""
    if not isinstance(value, SAEMetadata):
        if not isinstance(value, dict):
            raise TypeError(f"metadata: expected a dict (a JSON object), got {type(value).__name__}")
        value = SAEMetadata(value)
    return value


def check_positive_ints(cfg: Any, names: Sequence[str]) -> None:
    """Each of `cfg`'s fields `names` is a positive integer (`k` may be None)."""
    for name in names:
        v = getattr(cfg, name)
        if v is None and name == "k":
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}={v!r}: expected a positive integer, got {type(v).__name__}")
        if v < 1:
            raise ValueError(f"{name}={v!r}: expected a positive integer")


def check_bools(cfg: Any, names: Sequence[str], expected: str) -> None:
    """Each of `cfg`'s fields `names` is a bool (`expected` says how, e.g. "JSON true or false")."""
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, bool):
            raise TypeError(f"{name}={v!r}: expected a boolean ({expected}), got {type(v).__name__}")


def check_strings(cfg: Any, names: Sequence[str]) -> None:
    """`cfg.device` as a string (a torch.device converted), then each of the fields `names` a string."""
    if isinstance(cfg.device, torch.device):
        cfg.device = str(cfg.device)
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, str):
            raise TypeError(f"{name}={v!r}: expected a string, got {type(v).__name__}")


class ConfigDtype:
    """A config's `dtype` field read as a torch dtype (SAEConfig, TranscoderConfig, CLTConfig)."""

    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as a torch dtype."""
        return parse_dtype(self.dtype)


# ----------------------------------------------------------------------------------------------
# the modules: weights, hook points, building
# ----------------------------------------------------------------------------------------------
# An SAE's and a per-layer transcoder's own hook points, with sae-lens' names.
HOOK_NAMES = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_output",
    "hook_sae_recons",
    "hook_sae_error",
)


def identity(x: Tensor) -> Tensor:
    """`x` itself: a hook point's stand-in on a pass past the hooks."""
    return x


NO_HOOKS: dict[str, Any] = dict.fromkeys(HOOK_NAMES, identity)


def hooks_of(module: Any) -> dict[str, Any]:
    """The hook points of HOOK_NAMES on `module`, by name."""
    return {name: getattr(module, name) for name in HOOK_NAMES}


def add_hook_points(module: nn.Module) -> None:
    """Give `module` a HookPoint for each of HOOK_NAMES, named after it."""
    for name in HOOK_NAMES:
        setattr(module, name, HookPoint())
    for name in HOOK_NAMES:
        getattr(module, name).name = name


def check_init_seed(seed: Any) -> None:
    """init_weights' seed: an integer or None."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"init_weights: seed={seed!r}: expected an integer or None")


def zero_if_present(module: nn.Module, names: Sequence[str]) -> None:
    """Zero each of the tensors `names` that `module` holds."""
    for name in names:
        if hasattr(module, name):
            getattr(module, name).zero_()


def load_built(cls: Any, cfg: Any, state: dict[str, Tensor], device: str | torch.device) -> Any:
    """`cls(cfg)` built on the meta device (nothing allocated), given `state`'s tensors, and `cfg.device`
    set to `device`."""
    cfg.device = "meta"  # build without allocating, then take the loaded tensors
    module = cls(cfg)
    module.load_state_dict(state, strict=True, assign=True)
    cfg.device = str(device)
    return module


class CoderWeights:
    """The dtype and device of a module's weights (read from its `W_enc`)."""

    W_enc: Tensor

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of its weights."""
        return self.W_enc.dtype

    @property
    def device(self) -> torch.device:
        """The device its weights are on."""
        return self.W_enc.device


class CoderHookPoints(CoderWeights):
    """A module with the hook points of HOOK_NAMES (an SAE, a per-layer transcoder)."""

    hook_sae_input: HookPoint
    hook_sae_acts_pre: HookPoint
    hook_sae_acts_post: HookPoint
    hook_sae_output: HookPoint
    hook_sae_recons: HookPoint
    hook_sae_error: HookPoint

    @property
    def hook_names(self) -> tuple[str, ...]:
        """The names of its own hook points (spliced, each is prefixed with the model's hook name)."""
        return HOOK_NAMES

    def reset_hooks(self, including_permanent: bool = False) -> None:
        """Remove the functions attached to its own hook points."""
        for name in HOOK_NAMES:
            getattr(self, name).remove_hooks("both", including_permanent=including_permanent)


# ----------------------------------------------------------------------------------------------
# weights files
# ----------------------------------------------------------------------------------------------
# sae-lens' folder: these two files; the weights record the sha256 of the cfg.json saved with them.
CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
DIGEST_KEY = "interp_gpt_cfg_sha256"


def read_safetensors(path: Path, device: str | torch.device) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file; CheckpointError naming it when it cannot be read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118 (safe_open is no Mapping)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e


def check_tensors(
    state: dict[str, Tensor], shapes: dict[str, tuple[int, ...]], where: str | Path, what: str = ""
) -> None:
    """Refuse, naming the file `where`, missing / unexpected / mis-shaped tensors (the message goes on
    with `what` before the list) and non-float or non-finite values (those of a `MappedState`'s file
    tensors read through a fresh map, whose pages are not kept)."""
    missing = [k for k in shapes if k not in state]
    unexpected = [k for k in state if k not in shapes]
    wrong = [
        f"{k} {tuple(state[k].shape)} (expected {shapes[k]})"
        for k in shapes
        if k in state and tuple(state[k].shape) != shapes[k]
    ]
    if missing or unexpected or wrong:
        parts = [f"missing {missing}" if missing else "", f"unexpected {unexpected}" if unexpected else ""]
        parts.append(f"mis-shaped {', '.join(wrong)}" if wrong else "")
        raise CheckpointError(f"{where}: {what}" + "; ".join(p for p in parts if p))
    files = getattr(state, "files", {})  # a MappedState: those tensors' values are read through a fresh map
    bad = [k for k, v in state.items() if k not in files and not (v.is_floating_point() and v.isfinite().all())]
    if bad:
        raise CheckpointError(f"{where}: tensor {bad[0]!r} holds non-finite (or non-float) values")
    for f in files.values():
        f.check_finite(where)


def check_digest(meta: dict[str, str], cfg_path: Path, what: str, text: str | None = None) -> None:
    """Refuse weights whose metadata records the digest of another cfg.json than the one at `cfg_path`
    (`text`: its contents, when already read); `what` names the module to save again."""
    digest = meta.get(DIGEST_KEY)
    if digest is not None and digest != config_digest(cfg_path.read_text(encoding="utf-8") if text is None else text):
        raise CheckpointError(
            f"{cfg_path.parent}: {WEIGHTS_FILENAME} was saved with another {CFG_FILENAME} than the one beside it "
            f"(an interrupted save?); save the {what} again"
        )


@contextmanager
def removed_if_left_empty(folder: Path) -> Iterator[None]:
    """On any error in the block, remove `folder` if the block created it and left it empty."""
    created = not folder.exists()
    try:
        yield
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------
def explained_variance(x: Tensor, x_hat: Tensor) -> float:
    """sae-lens' explained variance of rows `x` `[n, d]` by `x_hat`: 1 - SSE / total sum of squares.

    Example:
        >>> explained_variance(x, sae(x))
        0.93
    """
    x, x_hat = x.double(), x_hat.double()
    return float(1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())


def check_eval_inputs(model: Any, tokens: Any, batch_size: Any, caller: str) -> tuple[Tensor, int]:
    """An evaluation's `tokens` `[batch, pos]` (fit for `model`) and `batch_size` (>= 1), checked."""
    tokens = check_tokens(tokens, model.cfg.d_vocab, model.cfg.n_ctx, caller=caller)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    return tokens, batch_size


def zero_ablation(act: Tensor, hook: Any) -> Tensor:
    """A hook function replacing the activation by zeros."""
    return torch.zeros_like(act)


def ce_batches(
    model: Any,
    tokens: Tensor,
    batch_size: int,
    names: list[str],
    splice: Callable[[], Any],
    zeroed: list[str],
    ce: dict[str, float],
) -> Iterator[Any]:
    """The evaluation loop's CE losses, batch by batch: for each batch the clean run's loss (into
    ce["clean"]) and its cache of `names`, yielded; then, once the caller is done with it, the loss
    with `splice()` entered (ce["spliced"]), the KL divergence of the spliced next-token distribution
    from the clean one (ce["kl"], mean over positions) and the loss with the hooks `zeroed`
    zero-ablated (ce["zero"]), each weighted by the batch's share of `tokens`."""
    ce.setdefault("kl", 0.0)
    for i in range(0, tokens.shape[0], batch_size):
        t = tokens[i : i + batch_size].to(model.W_E.device)
        w = t.shape[0] / tokens.shape[0]
        logits, cache = model.run_with_cache(t, names_filter=names)
        ce["clean"] += float(model.loss_fn(logits, t)) * w
        yield cache
        with splice():
            spliced = model(t)
        ce["spliced"] += float(model.loss_fn(spliced, t)) * w
        ce["kl"] += kl_divergence(logits, spliced) * w
        del logits, spliced
        fwd_hooks = [(name, zero_ablation) for name in zeroed]
        ce["zero"] += float(model.run_with_hooks(t, return_type="loss", fwd_hooks=fwd_hooks)) * w


def kl_divergence(clean: Tensor, other: Tensor, rows: int = 8) -> float:
    """Mean over positions of KL(softmax(clean) || softmax(other)) for logits `[batch, pos, d_vocab]`
    (sae-lens' and SAEBench's `kl_div`), in float64 sums, a few rows at a time (a vocabulary's logits are large)."""
    total = 0.0
    for i in range(0, clean.shape[0], rows):
        p = torch.log_softmax(clean[i : i + rows].float(), dim=-1)
        q = torch.log_softmax(other[i : i + rows].float(), dim=-1)
        total += float((p.exp() * (p - q)).sum(-1).double().sum())
    return total / (clean.shape[0] * clean.shape[1])


def ce_metrics(ce: dict[str, float], n_rows: int) -> dict[str, float]:
    """The CE fields of an evaluation's result (ce_clean ... ce_loss_recovered, kl_div) and n_tokens."""
    out = {
        "ce_clean": ce["clean"],
        "ce_spliced": ce["spliced"],
        "ce_zero_ablation": ce["zero"],
        "ce_loss_recovered": (ce["zero"] - ce["spliced"]) / (ce["zero"] - ce["clean"]),
        "n_tokens": float(n_rows),
    }
    if "kl" in ce:
        out["kl_div"] = ce["kl"]
    return out


# ----------------------------------------------------------------------------------------------
# the training commands (train-sae, train-transcoder)
# ----------------------------------------------------------------------------------------------
def add_corpus_arguments(p: argparse.ArgumentParser) -> None:
    """--data and --val-frac: the text to train on and its validation tail."""
    add_data_argument(p, "the text to train on (each file split by --val-frac)")
    p.add_argument("--val-frac", type=float, default=0.1, help="tail of each file kept for validation")


def add_feature_arguments(p: argparse.ArgumentParser, architectures: tuple[str, ...], helps: tuple[str, ...]) -> None:
    """--architecture (one of `architectures`, the first by default), --d-sae, --k, --l1-coefficient; `helps`
    says each."""
    p.add_argument("--architecture", choices=architectures, default=architectures[0], help=helps[0])
    p.add_argument("--d-sae", type=int, default=1024, help=helps[1])
    p.add_argument("--k", type=int, default=32, help=helps[2])
    p.add_argument("--l1-coefficient", type=float, default=1.0, help=helps[3])


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The optimisation and run options train-sae and train-transcoder share (checked by `check_sae_args`)."""
    p.add_argument("--lr", type=float, default=4e-4, help="Adam's learning rate")
    p.add_argument("--lr-warm-up-steps", type=int, default=0, help="steps of linear warm-up from 0")
    p.add_argument("--lr-decay-steps", type=int, default=0, help="final steps of linear decay to 0")
    p.add_argument("--batch-size", type=int, default=4096, help="rows (tokens) per step")
    p.add_argument("--context-size", type=int, default=128, help="tokens per window (BOS first)")
    p.add_argument("--n-tokens", type=int, default=4_000_000, help="training tokens (steps x batch size)")
    p.add_argument("--val-windows", type=int, default=0, help="validation windows for the metrics (0: all)")
    p.add_argument("--log-every", type=int, default=100, help="steps between log lines (and NaN checks)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights and the data order")
    p.add_argument("--threads", type=int, default=0, help="torch threads, 0 for torch's own choice (default: 0)")


def add_out_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """--out (a folder for `what` and metrics.json) and --no-progress."""
    out = f"folder for {what} (a run stopped by NaN or inf saves its last good state in OUT/last_good)"
    p.add_argument("--out", required=True, help=out)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def config_from_options(cls: Any, fields: dict[str, Any], options: Iterable[str]) -> Any:
    """`cls(**fields)`; an error about one of `options` names the option (--lr-decay-steps), not the field."""
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:  # name the option, not the config field
        msg = str(e).removeprefix(f"{cls.__name__}: ")
        field = next((f for f in options if msg.startswith(f + "=")), None)
        raise ValueError("--" + field.replace("_", "-") + msg[len(field) :] if field else msg) from None


def check_hooks(model: Any, hooks: list[str], option: str) -> None:
    """The hooks exist on `model` (else one line naming the option, with the close names)."""
    try:
        model.hook_points(hooks, arg=option)
    except KeyError as e:
        raise ValueError(f"{option}: {e.args[0]}") from None


def start_training_run(args: argparse.Namespace) -> Any:
    """The start of a training run: --threads and --seed applied, the --model loaded, in eval mode."""
    from ..loading import from_pretrained

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = from_pretrained(args.model)
    model.eval()
    return model


def run_subcommand(run: Callable[..., Any], args: argparse.Namespace, name: str) -> int:
    """`interp-gpt <name> ...`: `run(args, argv)`, argv the command's own (recorded in metrics.json)."""
    argv = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == name else None
    run(args, argv)
    return 0


def command_main(
    prog: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[..., Any],
    argv: list[str] | None,
) -> int:
    """`python -m <prog> ...`: parse `argv` (sys.argv's by default), run; the exit status (2: bad input)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        run(args, argv)
    except BAD_INPUT as e:
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 2
    return 0
