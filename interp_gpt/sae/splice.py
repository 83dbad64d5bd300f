"""Splicing SAEs into the model: `add_sae`, `reset_saes`, `with model.saes([...])` (sae-lens' /
transformer-lens' HookedSAETransformer names).

While spliced, the model's hook point at `sae.cfg.hook_name` (say `blocks.1.hook_resid_pre`) is
replaced by a `SplicedHookPoint` that keeps its name and its hooks and passes the activation
through the SAE; the SAE's own hook points hang under it and join `model.hook_dict`:

    blocks.1.hook_resid_pre                      the model's activation (hooks here run first, then the SAE)
    blocks.1.hook_resid_pre.hook_sae_input       what the SAE reads     [..., d_in]
    blocks.1.hook_resid_pre.hook_sae_acts_pre    encoder pre-activations [..., d_sae]
    blocks.1.hook_resid_pre.hook_sae_acts_post   feature activations    [..., d_sae]
    blocks.1.hook_resid_pre.hook_sae_recons      the reconstruction     [..., d_in]
    blocks.1.hook_resid_pre.hook_sae_error       x - reconstruction     (use_error_term=True only)
    blocks.1.hook_resid_pre.hook_sae_output      what flows downstream  [..., d_in]

so run_with_cache, run_with_hooks, the patching sweeps and attribution patching take them by name.
The SAE's parameters stay out of the model's state_dict and parameters().

With `use_error_term=True` the output is the reconstruction plus the error x - x_hat of a hook-free
pass, as in sae-lens, so interventions on the features change the output and nothing else does. We
add it as `x + (x_hat - x_hat_clean)`, which is x bit for bit while no hook changes anything (sae-lens'
`x_hat + (x - x_hat_clean)` is x to rounding). Gradients reach x through x_hat only, as in sae-lens
(Marks et al. 2024, A.3); the error node gets its own gradient when a hook watches it.

Spliced SAEs act in every thread's passes (like `add_hook`), until removed.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..hooks import HookPoint, _HasHooks
from ..sources import hub_id
from .core import SAE

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["SAESplicingMixin", "SplicedHookPoint", "check_sae_fits"]

_INNER = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons")


class _SplicedHasHooks(_HasHooks):
    """`has_hooks` of a spliced point: always true as a truth value (the SAE runs there); called as
    transformer-lens' method it answers for the hooks users attached."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True


class SplicedHookPoint(HookPoint):
    """The model's hook point with an SAE spliced in: its own hooks first, then the SAE.

    It shares the hook lists of the point it replaces, so handles taken on either keep working.
    """

    def __init__(self, original: HookPoint, sae: SAE, use_error_term: bool) -> None:
        super().__init__()
        self.name = original.name
        self.fwd_hooks = original.fwd_hooks
        self.bwd_hooks = original.bwd_hooks
        self.ctx = original.ctx
        object.__setattr__(self, "original", original)  # plain attributes: not submodules, so the
        object.__setattr__(self, "sae", sae)  # SAE's parameters stay out of the model's state_dict
        self.use_error_term = bool(use_error_term)
        for name in _INNER + (("hook_sae_error",) if use_error_term else ()) + ("hook_sae_output",):  # pass order
            self.add_module(name, getattr(sae, name))

    original: HookPoint
    sae: SAE

    @property
    def has_hooks(self) -> _HasHooks:
        return _SplicedHasHooks(self)  # true: the model's fast paths must call this point, the SAE runs here

    def forward(self, x: Tensor) -> Tensor:
        x = super().forward(x)  # the hooks on the model's own point (a patch, a cache) act first
        sae = self.sae
        acts, state = sae._encode(x)
        recons = sae._decode(acts, state)
        if self.use_error_term:
            with torch.no_grad():
                if any(getattr(sae, n).has_hooks for n in _INNER):
                    clean = sae._decode(*sae._encode(x, hooked=False), hooked=False)
                else:  # nothing could have changed the pass: it was the clean one
                    clean = recons.detach()
            base = x.detach().to(recons.dtype)
            error_point: HookPoint = sae.hook_sae_error
            if error_point.has_hooks:
                error = base - clean
                if torch.is_grad_enabled():  # a node of its own, so attribution patching sees a gradient here
                    error = error.requires_grad_().clone()
                before = error.detach().clone()
                error = error_point(error)
                out = base + (recons - clean) + (error - before)  # = recons + error, exactly x if unchanged
            else:
                out = base + (recons - clean)
        else:
            out = recons
        return sae.hook_sae_output(out)

    def extra_repr(self) -> str:
        return f"{self.name}, sae={self.sae.extra_repr()}, use_error_term={self.use_error_term}"


def _width(cfg: Config, name: str) -> int | None:
    """The last dimension of the activation at hook `name` (None: it has no fixed width)."""
    last = name.rsplit(".", 1)[-1]
    if last in ("hook_q", "hook_k", "hook_v", "hook_z"):
        return cfg.d_head
    if name.endswith(("mlp.hook_pre", "mlp.hook_post")):
        return cfg.d_mlp
    if last in ("hook_attn_scores", "hook_pattern", "hook_tokens"):
        return None
    if last == "hook_scale":
        return 1
    if name == "unembed.hook_out":
        return cfg.d_vocab
    return cfg.d_model


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
    width = _width(cfg, name)
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
    trained_on, model_name = sae.cfg.metadata.get("model_name"), getattr(cfg, "model_name", None)
    if (
        isinstance(trained_on, str)
        and isinstance(model_name, str)
        and model_name not in ("", "custom")
        and _model_key(trained_on) != _model_key(model_name)
    ):
        warnings.warn(
            f"{arg}: the SAE was trained on {trained_on!r} (its cfg.metadata.model_name) but the model is "
            f"{model_name!r}: its features may mean nothing on this model",
            UserWarning,
            stacklevel=3,
        )
    return name


def _model_key(name: str) -> str:
    """A model name as compared: its last path part, lower case, transformer-lens' aliases resolved."""
    return hub_id(name.strip().rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower())


class SAESplicingMixin:
    """`add_sae`, `reset_saes`, `saes(...)`, `run_with_saes`, `run_with_cache_with_saes`: GPT's SAE
    splicing (transformer-lens' HookedSAETransformer API). See the module's docs."""

    cfg: Config
    hook_dict: dict[str, HookPoint]
    _all_hook_points: list[HookPoint]

    if TYPE_CHECKING:

        def setup_hooks(self) -> None: ...
        def _unknown_hook_error(self, name: str) -> KeyError: ...
        def get_submodule(self, target: str) -> Any: ...
        def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...
        def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...
        def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...
        def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    @property
    def acts_to_saes(self) -> dict[str, SAE]:
        """The spliced SAEs by the hook name they sit at (transformer-lens' name)."""
        return {hp.name: hp.sae for hp in getattr(self, "_all_hook_points", []) if isinstance(hp, SplicedHookPoint)}

    def _check_sae(self, sae: Any, use_error_term: Any) -> str:
        name = check_sae_fits(self, sae)
        if not isinstance(use_error_term, bool):
            raise TypeError(f"use_error_term: expected True or False, got {use_error_term!r}")
        p = next(iter(self.parameters()), None)
        if p is not None and (sae.dtype != p.dtype or sae.device != p.device):
            raise ValueError(
                f"sae is {sae.dtype} on {sae.device} but the model is {p.dtype} on {p.device}: "
                f"use sae.to({p.dtype}, {str(p.device)!r}) (or SAE.from_pretrained(..., dtype=, device=))"
            )
        owner = getattr(sae, "_spliced_in", None)
        if owner is not None and owner is not self.hook_dict[name]:
            raise ValueError(
                f"this SAE is already spliced in at {owner.name!r} (of this or another model); take it out "
                "first (reset_saes), or splice a copy (copy.deepcopy(sae))"
            )
        return name

    def add_sae(self, sae: SAE, use_error_term: bool | None = False) -> None:
        """Splice `sae` in at its `cfg.metadata.hook_name`, replacing any SAE already there.

        `use_error_term=True` adds back the SAE's error, so the model computes exactly what it computes
        without the SAE while the features are still there to read, patch and differentiate.

        Example:
            >>> model.add_sae(sae)
            >>> _, cache = model.run_with_cache("Hello")
            >>> cache["blocks.1.hook_resid_pre.hook_sae_acts_post"].shape   # [batch, pos, d_sae]
        """
        use_error_term = False if use_error_term is None else use_error_term
        name = self._check_sae(sae, use_error_term)
        current = self.hook_dict[name]
        original = current.original if isinstance(current, SplicedHookPoint) else current
        if isinstance(current, SplicedHookPoint):
            self._unsplice(current)
        spliced = SplicedHookPoint(original, sae, use_error_term)
        self._put(name, spliced)
        object.__setattr__(sae, "_spliced_in", spliced)

    def _put(self, name: str, point: HookPoint) -> None:
        parent_name, _, attr = name.rpartition(".")
        parent = self.get_submodule(parent_name) if parent_name else self
        setattr(parent, attr, point)
        self.setup_hooks()

    def _unsplice(self, point: SplicedHookPoint) -> None:
        for n in point.sae.hook_names:
            getattr(point.sae, n).name = n
        if getattr(point.sae, "_spliced_in", None) is point:
            object.__setattr__(point.sae, "_spliced_in", None)

    def reset_saes(self, act_names: str | Sequence[str] | None = None) -> None:
        """Take out the SAEs at `act_names` (all of them by default); the model is as before.

        Example:
            >>> model.reset_saes()
        """
        current = self.acts_to_saes
        if act_names is None:
            names = list(current)
        else:
            names = [act_names] if isinstance(act_names, str) else list(act_names)
            unknown = [n for n in names if n not in current]
            if unknown:
                close = difflib.get_close_matches(unknown[0], list(current), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; SAEs sit at: {list(current) or 'none'}"
                raise KeyError(f"act_names: no SAE is spliced in at {unknown[0]!r}{hint}")
        for n in names:
            point = self.hook_dict[n]
            assert isinstance(point, SplicedHookPoint)
            self._unsplice(point)
            self._put(n, point.original)

    @contextmanager
    def saes(
        self, saes: SAE | Sequence[SAE] = (), reset_saes_end: bool = True, use_error_term: bool | None = None
    ) -> Iterator[Any]:
        """Context in which `saes` are spliced in; on exit (an error too) the model is as it was,
        any SAE they displaced put back.

        Example:
            >>> with model.saes([sae], use_error_term=True):
            ...     logits, cache = model.run_with_cache(tokens)
        """
        saes = [saes] if isinstance(saes, SAE) else list(saes)
        before: dict[str, tuple[SAE, bool]] = {
            hp.name: (hp.sae, hp.use_error_term) for hp in self.hook_dict.values() if isinstance(hp, SplicedHookPoint)
        }
        added: list[str] = []
        try:
            for sae in saes:
                self.add_sae(sae, use_error_term=bool(use_error_term))
                added.append(sae.cfg.hook_name)  # type: ignore[arg-type]
            yield self
        finally:
            if reset_saes_end:
                for n in dict.fromkeys(added):
                    if n in self.acts_to_saes:
                        self.reset_saes(n)
                    if n in before:
                        self.add_sae(before[n][0], use_error_term=before[n][1])

    def run_with_saes(
        self, *model_args: Any, saes: SAE | Sequence[SAE] = (), use_error_term: bool | None = None, **kwargs: Any
    ) -> Any:
        """The model's output with `saes` spliced in for this call.

        Example:
            >>> logits = model.run_with_saes("Hello", saes=[sae])
        """
        with self.saes(saes, use_error_term=use_error_term):
            return self(*model_args, **kwargs)

    def run_with_cache_with_saes(
        self, *model_args: Any, saes: SAE | Sequence[SAE] = (), use_error_term: bool | None = None, **kwargs: Any
    ) -> Any:
        """`run_with_cache` with `saes` spliced in for this call.

        Example:
            >>> logits, cache = model.run_with_cache_with_saes("Hello", saes=[sae])
        """
        with self.saes(saes, use_error_term=use_error_term):
            return self.run_with_cache(*model_args, **kwargs)

    def run_with_hooks_with_saes(
        self, *model_args: Any, saes: SAE | Sequence[SAE] = (), use_error_term: bool | None = None, **kwargs: Any
    ) -> Any:
        """`run_with_hooks` with `saes` spliced in for this call.

        Example:
            >>> logits = model.run_with_hooks_with_saes("Hi", saes=[sae], fwd_hooks=[(name, fn)])
        """
        with self.saes(saes, use_error_term=use_error_term):
            return self.run_with_hooks(*model_args, **kwargs)
