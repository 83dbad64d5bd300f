"""Training a tuned lens: tuned-lens 0.2's objective and optimiser on our hook points.

Phases, in the order of tuned-lens' training loop (its `scripts/train_loop.py`):

1. Data: text (a file, a folder of .txt files, a list of them, or an iterable of strings) cut into
   windows of `context_size` tokens, BOS first, as the activation store cuts them; or a token tensor
   `[n, pos]` as it is. Each epoch visits the windows in the order
   `torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))`, `batch_size` at a
   time (a last part-batch is left out).
2. Forward: one `run_with_cache` per batch under `torch.no_grad()`, caching every
   `blocks.{l}.hook_resid_pre`; the final log-probs are the targets (token shift 0).
3. Loss: per layer, KL(final || lens) averaged over batch and positions; each layer's loss is
   back-propagated in turn (tuned-lens does so to save memory), so the gradient is that of their sum.
4. Step: gradients clipped to norm 1 over all translators together, SGD with Nesterov momentum 0.9,
   weight decay 1e-3 and lr 0.1 (tuned-lens' `lr_scale=1` times `1 - momentum`), decayed linearly to
   0 over `steps` (no warm-up for SGD). Unlike tuned-lens we compute in the model's dtype (it uses
   bfloat16 autocast for the lens).

`fit_tuned_lens` saves the lens (tuned-lens' folder) and `training_state.pt` (step, optimiser) at the
end and when interrupted (Ctrl-C), if given `save_to`; `resume=True` continues from there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from ..checkpoints.sources import CheckpointError
from ..checks import check_float, check_int_in_range, check_seed, check_text_files, check_token_ids, check_type
from ..files import atomic_path
from ..model.gpt import GPT
from .grad import check_not_inference
from .tuned import TunedLens, check_lens_folder, read_torch_file

__all__ = ["fit_tuned_lens", "lens_kl", "lens_windows", "windows_digest", "LensDiverged"]

STATE_FILE = "training_state.pt"


def lens_windows(model: GPT, data: Any, context_size: int = 128) -> Tensor:
    """`data` as token windows `[n, context_size]`, BOS first (the activation store's cut): a path or a
    list of `Path`s (files or folders of .txt files, `check_text_files`' rule), an iterable of texts,
    or a token tensor `[n, pos]` (returned as it is, after its checks).

    Example:
        >>> lens_windows(model, "data/corpus", context_size=64).shape
        torch.Size([..., 64])
    """
    from ..store.text import TokenWindows

    if isinstance(data, Tensor):
        if data.ndim != 2 or data.shape[1] > model.cfg.n_ctx or data.shape[0] == 0:
            raise ValueError(
                f"data: token tensor of shape {tuple(data.shape)}, expected [n >= 1, pos <= n_ctx={model.cfg.n_ctx}]"
            )
        return check_token_ids(data, model.cfg.d_vocab, "data")
    context_size = check_int_in_range(context_size, "context_size", 2, model.cfg.n_ctx, "contexts")
    if model.tokenizer is None:
        raise ValueError("data: text needs the model's tokenizer and this model has none; pass token ids")
    paths = isinstance(data, (str, os.PathLike)) or (
        isinstance(data, (list, tuple)) and bool(data) and all(isinstance(d, os.PathLike) for d in data)
    )
    for item in (data if isinstance(data, (list, tuple)) else [data]) if paths else []:
        if not os.path.exists(item):  # also False for a text too long to be a file name (no OSError 36)
            text = os.fspath(item)
            shown = repr(text if len(text) <= 60 else text[:60] + "...")
            raise FileNotFoundError(
                f"data {shown}: no such file or folder; a str is read as a path (a text file or a folder of .txt "
                "files), a list of str as the texts themselves: to train on this text, pass [text]"
            )
    source: Any = check_text_files(data, "data") if paths else data
    rows = list(TokenWindows(model.tokenizer, source, context_size, prepend_bos=True))
    if not rows:
        raise ValueError(f"data: too short for one window of context_size={context_size} tokens")
    return torch.stack(rows)


class LensDiverged(FloatingPointError):
    """`fit_tuned_lens` stopped: the KL at `step` (0-based) is `kl` (NaN or inf), the learning rate `lr` too large.

    Example:
        >>> str(LensDiverged(3, float("nan"), 1e30))
        'fit_tuned_lens: step 3: the KL is nan; lower lr=1e+30'
    """

    def __init__(self, step: int, kl: float, lr: float) -> None:
        super().__init__(f"fit_tuned_lens: step {step}: the KL is {kl}; lower lr={lr}")
        self.step, self.kl, self.lr = step, kl, lr


def windows_digest(windows: Tensor) -> str:
    """The sha256 of token windows `[n, pos]` (their shape, then the ids as little-endian int64): the data's
    identity that `fit_tuned_lens(resume=True)` compares, as a harvest's `data_sha256` identifies its text.

    Example:
        >>> windows_digest(torch.zeros(2, 3, dtype=torch.long)) == windows_digest(torch.zeros(2, 3, dtype=torch.int32))
        True
        >>> windows_digest(torch.zeros(2, 3, dtype=torch.long)) == windows_digest(torch.zeros(3, 2, dtype=torch.long))
        False
    """
    import hashlib

    h = hashlib.sha256(repr(tuple(windows.shape)).encode())
    h.update(windows.detach().to("cpu", torch.int64).contiguous().numpy().astype("<i8").tobytes())
    return h.hexdigest()


def _save(lens: TunedLens, folder: Path, step: int, opt: torch.optim.Optimizer, settings: dict[str, Any]) -> None:
    lens.save(folder)
    with atomic_path(folder / STATE_FILE) as tmp:
        torch.save({"step": step, "optimizer": opt.state_dict(), "settings": settings}, tmp)


def _resume(lens: TunedLens, folder: Path, opt: torch.optim.Optimizer, settings: dict[str, Any]) -> int:
    """Load the lens and optimiser saved in `folder`; returns the steps already taken (0 if nothing saved).
    A folder holding a lens but no training state (`TunedLens.save`'s, tuned-lens' published ones) is refused:
    training from zero would overwrite that lens at the end."""
    if not (folder / STATE_FILE).is_file():
        found = [name for name in ("params.pt", "config.json") if (folder / name).exists()]
        if found:
            raise ValueError(
                f"resume=True: {str(folder)!r} holds a lens ({', '.join(found)}) but no {STATE_FILE} (the step and "
                "optimiser a stopped run saves), so there is no run to resume, and training from zero would "
                "overwrite that lens; to train it further, pass TunedLens.from_pretrained(folder, model) as "
                "model_or_lens (resume=False)"
            )
        return 0
    state = _read_state(folder / STATE_FILE)
    saved_digest = (state.get("settings") or {}).get("data_sha256")
    if saved_digest != settings["data_sha256"]:
        raise ValueError(
            f"data: the token windows differ from the ones the run saved in {folder / STATE_FILE} trained on "
            f"(data_sha256: {str(saved_digest)[:16]}... there, {settings['data_sha256'][:16]}... here); resume on "
            "the same data or save_to another folder"
        )
    if state.get("settings") != settings:
        saved = state.get("settings") or {}
        diff = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
        raise ValueError(
            f"resume: {folder / STATE_FILE} was saved by a run with other settings (saved, now): {diff}; "
            "resume with the same settings or save_to another folder"
        )
    loaded = TunedLens.from_pretrained(folder, lens.model)
    lens.layer_translators.load_state_dict(loaded.layer_translators.state_dict())
    try:
        opt.load_state_dict(state["optimizer"])
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise CheckpointError(
            f"{folder / STATE_FILE}: its optimizer state does not fit this lens' SGD ({type(e).__name__}: {e})"
        ) from e
    return int(state["step"])


def _read_state(path: Path) -> dict[str, Any]:
    """training_state.pt: {"step": an int >= 0, "optimizer": a dict, "settings": a dict}, or a CheckpointError."""
    state = read_torch_file(path, "fit_tuned_lens' training state")
    fields = (("step", int), ("optimizer", dict), ("settings", dict))
    if not isinstance(state, dict) or any(not isinstance(state.get(k), t) for k, t in fields) or state["step"] < 0:
        got = {k: type(state.get(k)).__name__ for k, _ in fields} if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{path}: expected fit_tuned_lens' training state, a dict of step (an int >= 0), optimizer and "
            f"settings (dicts); got {got}"
        )
    return state


@torch.inference_mode(False)  # trains under a caller's torch.inference_mode() (grad.py),
@torch.enable_grad()  # and under torch.no_grad() / set_grad_enabled(False) too
def fit_tuned_lens(
    model_or_lens: GPT | TunedLens,
    data: Any,
    *,
    steps: int,
    batch_size: int = 8,
    context_size: int = 128,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 1e-3,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    save_to: str | os.PathLike[str] | None = None,
    resume: bool = False,
    progress: bool = True,
) -> TunedLens:
    """Train a tuned lens on `model_or_lens` (a GPT: a fresh lens; a TunedLens: trained further) with
    tuned-lens 0.2's objective and optimiser (see the module's docstring), for `steps` steps of
    `batch_size` windows of `data` (`lens_windows`' forms). A function, not a method: `nn.Module.train`
    is taken, and the training loop is a phase apart from the lens, as tuned-lens keeps it. `seed`: the data
    order (epoch e shuffles with `seed + e`), an int 0..2**63 - 1 - steps, checked before any work.

    `save_to`: a folder; the lens (config.json, params.pt) and `training_state.pt` are written there at
    the end and when interrupted (Ctrl-C: saved, then the KeyboardInterrupt goes on). `resume=True`
    continues a run saved there (same settings, same data: the windows' `windows_digest`) from its step.

    Example:
        >>> lens = fit_tuned_lens(model, "data/corpus", steps=3, batch_size=2, context_size=32, progress=False)
        >>> lens_kl(lens, "data/corpus", context_size=32, max_windows=4).shape      # one KL per layer
        torch.Size([2])
    """
    lens, steps, batch_size, lr, momentum, max_grad_norm = _check_fit(
        model_or_lens, steps, batch_size, lr, momentum, weight_decay, max_grad_norm
    )
    # epoch e shuffles with seed + e (e < steps): every one of them a seed torch takes, checked before a step
    seed = check_seed(seed, "seed", "fit_tuned_lens", high=2**63 - 1 - steps)
    folder = None if save_to is None else check_lens_folder(save_to, "save_to", "fit_tuned_lens")  # before a step
    model = lens.model
    windows = lens_windows(model, data, context_size)
    n = windows.shape[0]
    if n < batch_size:
        raise ValueError(f"data: {n} windows of {windows.shape[1]} tokens, fewer than batch_size={batch_size}")
    if resume and save_to is None:
        raise ValueError("resume=True needs save_to: the folder a stopped run saved into")
    settings = dict(
        n_layers=len(lens), steps=steps, batch_size=batch_size, windows=list(windows.shape), lr=lr, momentum=momentum,
        weight_decay=weight_decay, max_grad_norm=max_grad_norm, seed=seed, data_sha256=windows_digest(windows),
    )  # fmt: skip
    opt = torch.optim.SGD(lens.parameters(), lr=lr, momentum=momentum, nesterov=True, weight_decay=weight_decay)
    start = _resume(lens, folder, opt, settings) if resume and folder is not None else 0
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(len(lens))]
    device = model.unembed.W_U.device
    per_epoch, epoch, order = n // batch_size, -1, torch.arange(n)
    done = start
    bar = tqdm(range(start, steps), initial=start, total=steps, desc="tuned lens", disable=not progress)
    try:
        for step in bar:
            # 1. data: this epoch's order
            if step // per_epoch != epoch:
                epoch = step // per_epoch
                order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            i = step % per_epoch
            batch = windows[order[i * batch_size : (i + 1) * batch_size]].to(device)
            # 2. forward and 3. loss
            total = _kl_backward(lens, batch, names, opt)
            if not torch.isfinite(torch.tensor(total)):
                raise LensDiverged(step, total, lr)
            # 4. step: clip, linear decay, SGD with Nesterov momentum
            torch.nn.utils.clip_grad_norm_(lens.parameters(), max_grad_norm)
            for group in opt.param_groups:
                group["lr"] = lr * (steps - step) / steps
            opt.step()
            done = step + 1
            bar.set_postfix(kl=f"{total:.4f}")
    except KeyboardInterrupt:
        if folder is not None:
            _save(lens, folder, done, opt, settings)
            print(f"fit_tuned_lens: interrupted after {done} of {steps} steps; saved in {folder} (resume=True goes on)")
        raise
    finally:
        bar.close()
    if folder is not None:
        _save(lens, folder, done, opt, settings)
    return lens


def _check_fit(
    model_or_lens: Any, steps: Any, batch_size: Any, lr: Any, momentum: Any, weight_decay: Any, max_grad_norm: Any
) -> tuple[TunedLens, int, int, float, float, float]:
    """`fit_tuned_lens`' arguments checked, by name: (the lens, steps, batch_size, lr, momentum, max_grad_norm)."""
    if not isinstance(model_or_lens, (GPT, TunedLens)):
        raise TypeError(
            f"fit_tuned_lens: model_or_lens must be a GPT or a TunedLens, got {type(model_or_lens).__name__}"
        )
    model = model_or_lens.model if isinstance(model_or_lens, TunedLens) else model_or_lens
    check_not_inference(model.named_parameters(), "model_or_lens", "fit_tuned_lens")
    check_not_inference(model_or_lens.named_parameters(), "model_or_lens", "fit_tuned_lens")
    lens = model_or_lens if isinstance(model_or_lens, TunedLens) else TunedLens.from_model(model_or_lens)
    steps = check_int_in_range(steps, "steps", 1, None)
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None)
    lr, max_grad_norm = check_float(lr, "lr", 0.0), check_float(max_grad_norm, "max_grad_norm", 0.0)
    momentum = check_float(momentum, "momentum", 0.0, 1.0)  # Nesterov needs momentum > 0
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not 0 <= weight_decay < 1e300:
        raise ValueError(
            f"fit_tuned_lens: weight_decay={weight_decay!r} is out of range: expected a finite number >= 0"
        )
    return lens, steps, batch_size, lr, momentum, max_grad_norm


def _kl_backward(lens: TunedLens, batch: Tensor, names: list[str], opt: torch.optim.Optimizer) -> float:
    """Phases 2 and 3 of a step: the targets and every layer's input in one pass without gradients, then
    KL(final || lens) per layer, back-propagated one layer at a time; returns the sum of the KLs."""
    with torch.no_grad():
        logits, cache = lens.model.run_with_cache(batch, names_filter=names)
        log_p = logits.float().log_softmax(-1)
        p = log_p.exp()
    opt.zero_grad(set_to_none=False)
    total = 0.0
    for layer, name in enumerate(names):
        log_q = lens(cache[name], layer).float().log_softmax(-1)
        kl = (p * (log_p - log_q)).sum(-1).mean()
        kl.backward()
        total += float(kl.detach())
    return total


@torch.no_grad()
def lens_kl(
    lens: TunedLens, data: Any, *, batch_size: int = 8, context_size: int = 128, max_windows: int | None = None
) -> Float[Tensor, " layer"]:
    """Per layer, KL(final || lens) in nats averaged over every position of `data` (`lens_windows`'
    forms; the first `max_windows` windows). A fresh `TunedLens.from_model(model)` gives the logit
    lens' numbers.

    Example:
        >>> kl = lens_kl(TunedLens.from_model(model), "data/corpus", context_size=32, max_windows=4)
        >>> kl.shape, bool((kl >= 0).all())
        (torch.Size([2]), True)
    """
    check_type(lens, TunedLens, "lens", "a TunedLens", "lens_kl")
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None)
    windows = lens_windows(lens.model, data, context_size)
    if max_windows is not None:
        windows = windows[: check_int_in_range(max_windows, "max_windows", 1, None)]
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(len(lens))]
    total = torch.zeros(len(lens), dtype=torch.float64)
    device = lens.model.unembed.W_U.device
    for i in range(0, windows.shape[0], batch_size):
        batch = windows[i : i + batch_size].to(device)
        logits, cache = lens.model.run_with_cache(batch, names_filter=names)
        log_p = logits.float().log_softmax(-1)
        for layer, name in enumerate(names):
            log_q = lens(cache[name], layer).float().log_softmax(-1)
            total[layer] += (log_p.exp() * (log_p - log_q)).sum(-1).double().sum().cpu()
    return (total / windows.numel()).float()
