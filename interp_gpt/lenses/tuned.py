"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned
Lens", arXiv:2303.08112), as tuned-lens 0.2 defines it, read off our hook points.

Phases, in the paper's words and in this file's order:

1. Translators: one affine map per layer l = 0..n_layers-1, `nn.Linear(d_model, d_model)`, zero at the
   start, on the residual stream entering the layer (`blocks.{l}.hook_resid_pre`, Hugging Face's
   `hidden_states[l]`). tuned-lens 0.2 keeps `num_hidden_layers` translators, the last layer's too.
2. Decoding: the translator's output is added to the stream (so weight decay pulls it towards the
   identity) and the model's own final LayerNorm and unembedding read it:
   `logits = unembed(ln_final(h + A_l h + b_l))`. A zero translator is the logit lens, exactly.
3. Saving and loading: tuned-lens' folder, `config.json` (`base_model_name_or_path`, `d_model`,
   `num_hidden_layers`, `bias`, `base_model_revision`, `unembed_hash`, `lens_type`) and `params.pt`
   (the translators' state dict: `"0.weight"`, `"0.bias"`, ...), so tuned-lens loads ours and we load
   its (with `torch.load(weights_only=True)` only).

Training (the paper's KL objective, tuned-lens' optimiser) is `interp_gpt.lenses.train.fit_tuned_lens`.

Raw or processed weights. fold_ln and center_unembed change no translator's input and no lens output
(log-probs), but center_writing_weights centres the residual stream itself: it takes away the stream's
mean, `m 1`. A translator blind to that direction (`A_l 1` along `1`, which ln_final takes away; every
lens trained on a centred stream, whose gradients never reach it) reads both streams alike; one that
reads it does not. `config.json` records the weights a lens was trained on under
`interp_gpt_model_processing` (a key tuned-lens ignores); a lens without it (tuned-lens' own, trained
on Hugging Face models) is taken as trained on raw weights. Where lens and model disagree on centring,
the translators decide (`reads_the_mean`): a lens that reads the mean is refused, naming both.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..cache import ActivationCache
from ..checkpoints.sources import CheckpointError
from ..checks import cached_activation, check_index, check_int, check_type, is_centred
from ..files import atomic_path
from ..model.gpt import GPT, LayerNorm

__all__ = [
    "TunedLens", "unembed_hash", "lens_processing", "reads_the_mean", "check_lens_folder", "read_torch_file",
    "PROCESSING_KEY",
]  # fmt: skip

PROCESSING_KEY = "interp_gpt_model_processing"  # config.json: the weights the lens was trained on
_RAW = {"fold_ln": False, "center_writing_weights": False, "center_unembed": False}
_LOAD_RAW = "GPT.from_pretrained_no_processing(...)"
_LOAD_PROCESSED = "GPT.from_pretrained(...)"


def unembed_hash(model: GPT) -> str:
    """tuned-lens' `unembed_hash` of `model`: sha256 of numpy's printout, one decimal, of the unembedding
    as Hugging Face stores it (`lm_head.weight`, `[d_vocab, d_model]` = `W_U.T`). numpy's print options
    are pinned to their defaults (tuned-lens takes whatever is set: the same under the defaults).

    Example:
        >>> len(unembed_hash(model))
        64
    """
    import hashlib

    w = model.unembed.W_U.detach().T.cpu().float().numpy()
    with np.printoptions(
        precision=8, threshold=1000, edgeitems=3, linewidth=75, suppress=False, nanstr="nan", infstr="inf",
        sign="-", floatmode="maxprec", legacy=False,
    ):  # fmt: skip
        text = np.array_str(w, precision=1)
    return hashlib.sha256(text.encode()).hexdigest()


def lens_processing(model: GPT) -> dict[str, bool]:
    """The weight processing of `model` as a tuned lens sees it, read from the weights: {"fold_ln": the
    LayerNorms are folded, "center_writing_weights": every writer to the residual stream (W_E, W_pos,
    each W_O, b_O, W_out, b_out) writes mean-zero vectors, "center_unembed": W_U's rows are mean-zero}.
    What `TunedLens.save` records; only centring the stream changes what a translator reads.

    Example:
        >>> lens_processing(model)
        {'fold_ln': True, 'center_writing_weights': True, 'center_unembed': True}
    """
    writers: list[Tensor] = [model.embed.W_E, model.pos_embed.W_pos]
    blocks: Any = model.blocks
    for block in blocks:
        writers += [block.attn.W_O, block.attn.b_O]
        if not model.cfg.attn_only:
            writers += [block.mlp.W_out, block.mlp.b_out]
    centred = model.cfg.normalization_type is not None and all(is_centred(w) for w in writers)
    return {
        "fold_ln": model.cfg.normalization_type == "LNPre",
        "center_writing_weights": centred,
        "center_unembed": is_centred(model.unembed.W_U),
    }


def read_torch_file(path: Path, what: str) -> Any:
    """A lens file written by `torch.save` (params.pt, training_state.pt), read with `weights_only=True`; one
    that cannot be read (empty, truncated, not a torch file, or holding objects other than tensors and plain
    containers) raises a `CheckpointError` (a ValueError) naming the file, its size and `what` it should hold.

    Example:
        >>> _ = Path("empty.pt").write_bytes(b"")
        >>> read_torch_file(Path("empty.pt"), "a state dict")
        Traceback (most recent call last):
        ...
        interp_gpt.checkpoints.sources.CheckpointError: empty.pt: expected a state dict written by torch.save, ...
    """
    try:
        with warnings.catch_warnings():  # torch's note on a foreign file's pickle protocol: the error says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # EOFError (empty), OSError (truncated), UnpicklingError (foreign), KeyError ...
        size = path.stat().st_size if path.is_file() else 0
        detail = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise CheckpointError(
            f"{path}: expected {what} written by torch.save, but torch.load(weights_only=True) cannot read its "
            f"{size:,} bytes (empty, truncated or not a torch file?): {detail}"
        ) from e


def check_lens_folder(path: Any, arg: str, caller: str | None = None) -> Path:
    """`path` as a folder a lens can be saved in: a folder, or a path not there yet, with no file at it or
    above it (where `mkdir` would fail), checked before any work so that a run never fails at its save.

    Example:
        >>> check_lens_folder("lenses/new", "save_to")
        PosixPath('lenses/new')
        >>> _ = Path("notes.txt").write_text("x")
        >>> check_lens_folder("notes.txt/lens", "save_to")
        Traceback (most recent call last):
        ...
        ValueError: save_to='notes.txt/lens': 'notes.txt' is a file; expected a folder path (config.json, params.pt)
    """
    where = f"{caller}: " if caller else ""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}{arg} must be a folder path (str or Path), got {type(path).__name__}")
    folder = Path(path)
    for at in (folder, *folder.parents):
        if at.exists():
            if not at.is_dir():
                blocked = " is a file" if at == folder else f": {str(at)!r} is a file"
                raise ValueError(
                    f"{where}{arg}={str(path)!r}{blocked}; expected a folder path (config.json, params.pt)"
                )
            break
    return folder


class TunedLens(nn.Module):
    """A tuned lens over `model`: per layer an affine translator on `blocks.{l}.hook_resid_pre`, read
    out by the model's own ln_final and unembedding: `logits = unembed(ln_final(h + A_l h + b_l))`.

    The translators start at zero (the logit lens). The model is used, not copied, and is no
    submodule: `lens.state_dict()` holds the translators only (`layer_translators.{l}.weight/bias`).
    Train it with `fit_tuned_lens`; save and load tuned-lens 0.2's folder with `save` / `from_pretrained`.

    Example:
        >>> lens = TunedLens.from_model(model)
        >>> _, cache = model.run_with_cache("The cat sat on the mat")
        >>> lens(cache["blocks.1.hook_resid_pre"], 1).shape        # [batch, pos, d_vocab]
        torch.Size([1, 9, 2048])
        >>> lens.forward_all(cache).shape                          # [layer, batch, pos, d_vocab]
        torch.Size([2, 1, 9, 2048])
    """

    layer_translators: nn.ModuleList

    def __init__(self, model: GPT, config: dict[str, Any] | None = None):
        super().__init__()
        check_type(model, GPT, "model", "an interp_gpt GPT", "TunedLens")
        object.__setattr__(self, "model", model)  # used, not registered: no model weights in state_dict
        self.model: GPT
        cfg = model.cfg
        W_U = model.unembed.W_U
        # As tuned-lens: a loaded lens keeps its file's fields but takes the hash of the model it now
        # serves (and we, the weight processing), so saving it again describes this model.
        self.config: dict[str, Any] = {
            "base_model_name_or_path": cfg.model_name,
            "d_model": cfg.d_model,
            "num_hidden_layers": cfg.n_layers,
            "bias": True,
            "base_model_revision": None,
            "lens_type": "linear_tuned_lens",
            **(config or {}),
            "unembed_hash": unembed_hash(model),
            PROCESSING_KEY: lens_processing(model),
        }
        translators = []
        for _ in range(cfg.n_layers):
            t = nn.Linear(cfg.d_model, cfg.d_model, bias=True, device=W_U.device, dtype=W_U.dtype)
            nn.init.zeros_(t.weight)
            nn.init.zeros_(t.bias)
            translators.append(t)
        self.layer_translators = nn.ModuleList(translators)

    @classmethod
    def from_model(cls, model: GPT) -> TunedLens:
        """A fresh lens for `model` (zero translators: the logit lens until trained).

        Example:
            >>> lens = TunedLens.from_model(model)
            >>> len(lens), lens.config["num_hidden_layers"]
            (2, 2)
        """
        return cls(model)

    def __len__(self) -> int:
        return len(self.layer_translators)

    def __getitem__(self, layer: int) -> nn.Linear:
        t = self.layer_translators[check_index(layer, len(self), "layer", "layers", caller="TunedLens")]
        assert isinstance(t, nn.Linear)
        return t

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self.layer_translators)

    # ----- decoding ------------------------------------------------------------------------------
    def _check_h(self, h: Any, layer: Any) -> int:
        check_type(h, Tensor, "h", "a tensor [..., d_model]", "TunedLens")
        d_model = self.model.cfg.d_model
        if not h.is_floating_point() or h.ndim == 0 or h.shape[-1] != d_model:
            raise ValueError(
                f"TunedLens: h has shape {tuple(h.shape)} ({h.dtype}), expected a float tensor [..., d_model={d_model}]"
            )
        n, layer = len(self), check_int(layer, "layer", "TunedLens")
        if not 0 <= layer < n:
            raise ValueError(
                f"TunedLens: layer={layer!r} is out of range: layers are 0..{n - 1} "
                f"(the stream entering each layer, blocks.{{layer}}.hook_resid_pre)"
            )
        return layer

    def transform_hidden(self, h: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        """The stream entering `layer` as the lens reads it: `h + A_l h + b_l` (tuned-lens' name).

        Example:
            >>> h = torch.randn(3, 128)
            >>> torch.equal(TunedLens.from_model(model).transform_hidden(h, 0), h)   # zero translator
            True
        """
        layer = self._check_h(h, layer)
        return h + self.layer_translators[layer](h)

    def unembed(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """The model's readout of any stream vector: its ln_final (statistics of `x` itself) and its
        unembedding, with the model's parameters as they are (no gradient flows into them).

        Example:
            >>> lens = TunedLens.from_model(model)
            >>> (lens.unembed(cache["blocks.1.hook_resid_post"]) - logits).abs().max() < 1e-4
            tensor(True)
        """
        ln = self.model.ln_final
        if isinstance(ln, LayerNorm):  # (normalization_type=None: no LayerNorm at all)
            w, b = (ln.w.detach(), ln.b.detach()) if ln.has_params else (None, None)
            x = F.layer_norm(x, x.shape[-1:], w, b, ln.eps)
        return x @ self.model.unembed.W_U.detach() + self.model.unembed.b_U.detach()

    def forward(self, h: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_vocab"]:
        """The lens' logits for `h`, the stream entering `layer` (blocks.{layer}.hook_resid_pre).

        Example:
            >>> lens = TunedLens.from_model(model)
            >>> lens(cache["blocks.0.hook_resid_pre"], 0).shape
            torch.Size([1, 15, 2048])
        """
        return self.unembed(self.transform_hidden(h, layer))

    @torch.no_grad()
    def forward_all(self, input: Any) -> Float[Tensor, "layer batch pos d_vocab"]:
        """The lens' logits at every layer: `input` is a cache holding every `hook_resid_pre`, a token
        tensor `[batch, pos]` or text (run once through the model, caching those hooks only).

        Example:
            >>> TunedLens.from_model(model).forward_all("Hello world").shape
            torch.Size([2, 1, 5, 2048])
        """
        names = [f"blocks.{layer}.hook_resid_pre" for layer in range(len(self))]
        if not isinstance(input, ActivationCache):
            _, input = self.model.run_with_cache(input, names_filter=names, return_type=None)
        resid = [cached_activation(input, name, "TunedLens.forward_all") for name in names]
        return torch.stack([self(h, layer) for layer, h in enumerate(resid)])

    # ----- files ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write tuned-lens 0.2's folder: `params.pt` (the translators' state dict), then `config.json`,
        each whole or not at all (other files in the folder stay). Returns the folder.

        Example:
            >>> folder = TunedLens.from_model(model).save("my_lens")
            >>> sorted(p.name for p in folder.iterdir())
            ['config.json', 'params.pt']
        """
        folder = check_lens_folder(path, "path", "TunedLens.save")
        state = {k: v.detach().cpu().clone() for k, v in self.layer_translators.state_dict().items()}
        with atomic_path(folder / "params.pt") as tmp:
            torch.save(state, tmp)
        with atomic_path(folder / "config.json") as tmp:
            tmp.write_text(json.dumps(self.config, indent=1) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], model: GPT) -> TunedLens:
        """A lens from tuned-lens 0.2's folder (`config.json` + `params.pt`), over `model`. Refused, by
        name, where it was made for another d_model or number of layers, for a residual stream centred
        otherwise (center_writing_weights) where its translators read the stream's mean (`reads_the_mean`), or
        where a tensor is missing, extra, mis-shaped or not finite.
        Where the lens' `unembed_hash` differs from the model's (on the same weight processing) it warns,
        as tuned-lens does.

        Example:
            >>> TunedLens.from_model(model).save("my_lens")
            PosixPath('my_lens')
            >>> TunedLens.from_pretrained("my_lens", model).config["num_hidden_layers"]
            2
        """
        where = f"tuned lens {str(path)!r}"
        check_type(model, GPT, "model", "an interp_gpt GPT", "TunedLens.from_pretrained")
        folder = Path(path)
        missing = [n for n in ("config.json", "params.pt") if not (folder / n).is_file()]
        if not folder.is_dir() or missing:
            raise FileNotFoundError(f"{where}: expected a folder holding config.json and params.pt; missing {missing}")
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except ValueError as e:
            raise CheckpointError(f"{where}: config.json is not valid JSON ({e})") from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{where}: config.json holds {type(config).__name__}, expected a JSON object")
        _check_config(config, model, where)
        lens = cls(model, config)
        state = read_torch_file(folder / "params.pt", "the translators' state dict (tuned-lens' params.pt)")
        _check_state(state, lens, where)
        _check_centring(config, state, model, where)
        lens.layer_translators.load_state_dict(state)
        return lens


def reads_the_mean(weight: Tensor) -> float:
    """How much a translator `A` (`[d_model, d_model]`) reads the residual stream's mean direction `1`: the
    largest entry of `A 1` less its mean (the part ln_final keeps), over the largest row sum of `|A|` (0 for a
    translator blind to the mean, as every one trained on a centred stream is, to rounding; 0 for a zero one).

    Example:
        >>> reads_the_mean(torch.eye(4)), reads_the_mean(torch.zeros(4, 4))
        (0.0, 0.0)
        >>> reads_the_mean(torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
        0.5
    """
    w = weight.detach().double()
    along = w.sum(-1)  # A 1
    scale = float(w.abs().sum(-1).max())
    return float((along - along.mean()).abs().max()) / scale if scale > 0 else 0.0


def _check_centring(config: dict[str, Any], state: dict[str, Tensor], model: GPT, where: str) -> None:
    """A lens trained on a stream centred otherwise than the model's loads only if its translators are blind to
    the stream's mean (`reads_the_mean` at rounding level): then it reads both streams alike."""
    lens_c = (config.get(PROCESSING_KEY) or _RAW)["center_writing_weights"]
    model_c = lens_processing(model)["center_writing_weights"]
    if lens_c == model_c:
        return
    weights = [(k, v) for k, v in state.items() if k.endswith("weight")]
    # rounding: ~eps / sqrt(d_model) of the largest row sum where the values were stored in a low precision
    tol = max(1e-4, 4 * max(torch.finfo(v.dtype).eps for _, v in weights) / model.cfg.d_model**0.5)
    name, worst = max(((k, reads_the_mean(v)) for k, v in weights), key=lambda kv: kv[1])
    if worst > tol:
        how = "centred" if lens_c else "raw"
        load = _LOAD_PROCESSED if lens_c else _LOAD_RAW
        raise ValueError(
            f"{where}: the lens was trained on a {how} residual stream ({PROCESSING_KEY}.center_writing_weights="
            f"{lens_c}) but the model's is {'centred' if model_c else 'raw'} (center_writing_weights={model_c}), and "
            f"its translators read the stream's mean (reads_the_mean of {name}: {worst:.3g} > {tol:.1g}), which "
            f"centring takes away: they would read other numbers; load the model with {load}"
        )


def _check_config(config: dict[str, Any], model: GPT, where: str) -> None:
    """Everything config.json says that must fit the model, checked before a tensor is read."""
    cfg = model.cfg
    for key, mine in (("d_model", cfg.d_model), ("num_hidden_layers", cfg.n_layers)):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: config.json {key}={value!r}, expected an int")
        if value != mine:
            raise ValueError(
                f"{where}: the lens has {key}={value} but the model {cfg.model_name!r} has {key}={mine}: "
                "it was made for another model"
            )
    if config.get("lens_type", "linear_tuned_lens") != "linear_tuned_lens":
        raise ValueError(f"{where}: lens_type={config['lens_type']!r}; only 'linear_tuned_lens' is known")
    if config.get("bias", True) is not True:
        raise ValueError(f"{where}: bias={config['bias']!r}; only translators with a bias (tuned-lens' default) load")
    recorded = config.get(PROCESSING_KEY) or _RAW  # tuned-lens' own lenses: Hugging Face's raw weights
    if not isinstance(recorded, dict) or not all(isinstance(recorded.get(k), bool) for k in _RAW):
        raise ValueError(f"{where}: config.json {PROCESSING_KEY}={recorded!r}, expected {_RAW}-like booleans")
    mine_p = lens_processing(model)
    lens_hash = config.get("unembed_hash")
    # the hash compares unembeddings processed alike (fold_ln and center_unembed change W_U, not the lens)
    if lens_hash and {k: recorded[k] for k in _RAW} == mine_p and lens_hash != unembed_hash(model):
        warnings.warn(
            f"{where}: its unembed_hash {lens_hash[:12]}... differs from the model's {unembed_hash(model)[:12]}...: "
            "the lens may have been trained with another unembedding",
            stacklevel=3,
        )


def _check_state(state: Any, lens: TunedLens, where: str) -> None:
    """params.pt holds exactly the translators' tensors, each of its shape and finite."""
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{where}: params.pt holds {type(state).__name__}, expected a state dict of tensors")
    want = {k: tuple(v.shape) for k, v in lens.layer_translators.state_dict().items()}
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    bad = [
        f"{k} {tuple(state[k].shape)} (expected {want[k]})" for k in want if k in state and state[k].shape != want[k]
    ]
    if missing or extra or bad:
        raise ValueError(f"{where}: params.pt: missing {missing}, unexpected {extra}, mis-shaped {bad}")
    nonfinite = [k for k, v in state.items() if not bool(torch.isfinite(v).all())]
    if nonfinite:
        raise ValueError(f"{where}: params.pt: {nonfinite} hold NaN or inf")
