"""Hook points and the machinery that attaches functions to them.

Every activation of the model passes through a named `HookPoint`. A hook point is
the identity until a function is attached; an attached forward function sees
`(tensor, hook)` and may return a replacement of the same shape, exactly as in
transformer-lens. Backward functions see the gradient of that activation.

`HookedModule` (the base class of `GPT`) adds the user-facing calls:
`add_hook`, `reset_hooks`, the `hooks(...)` context, `run_with_hooks` and
`run_with_cache`. Hooks added by a context or a `run_with_*` call are removed on
every exit path: normal return, an exception raised by a hook, KeyboardInterrupt.

The thread rule: hooks attached by `with model.hooks(...)`, `run_with_hooks` or
`run_with_cache` belong to the thread that attached them and fire only in that thread's
forward (and backward) passes, so two threads sharing a model never see each other's
patches or caches. Hooks attached with `add_hook` (permanent or not) belong to no thread:
they fire in every thread's passes.
"""

from __future__ import annotations

import difflib
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch
from torch import Tensor, nn

from .slices import Slice, slice_index

__all__ = [
    "explicit_paths",
    "HookFn",
    "NameFilter",
    "HookSpec",
    "HookPoint",
    "HasHooks",
    "HookedModule",
    "HookedRootModule",
    "Slice",
    "slice_index",
]

# One path per cache: inside `run_with_cache` every activation is computed by the explicit maths (LayerNorm
# written out, attention through its pattern), whichever hooks the cache watches, so an activation is
# bit-identical however it was cached (a names_filter, stop_at_layer, a full cache). Outside a cache the
# model takes the fused kernels (F.layer_norm, scaled_dot_product_attention) wherever no hook watches.
_EXPLICIT: ContextVar[bool] = ContextVar("interp_gpt_explicit_paths", default=False)


def explicit_paths() -> bool:
    """Whether a `run_with_cache` is running in this thread (the model then takes its explicit paths)."""
    return _EXPLICIT.get()


HookFn = Callable[..., Union[Tensor, None]]
NameFilter = Union[None, str, Sequence[str], Callable[[str], bool]]
HookSpec = tuple[Union[str, Callable[[str], bool]], HookFn]


@dataclass(eq=False)
class _Hook:
    """One attached function. `active` goes False on removal, so a backward hook
    registered on a tensor during the forward pass stops firing once removed."""

    fn: HookFn
    is_permanent: bool = False
    active: bool = field(default=True)
    owner: int | None = None  # the thread (threading.get_ident) it fires in; None: every thread


class HookPoint(nn.Module):
    """An identity module that hook functions can be attached to.

    Example:
        >>> hp = HookPoint(); hp.name = "demo"
        >>> hp.add_hook(lambda x, hook: x * 2)
        >>> hp(torch.ones(2))
        tensor([2., 2.])
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = ""  # set by HookedModule.setup_hooks: the module path, e.g. "blocks.0.attn.hook_q"
        self.fwd_hooks: list[_Hook] = []
        self.bwd_hooks: list[_Hook] = []
        self.ctx: dict[Any, Any] = {}  # a place for hooks to keep state between calls (transformer-lens' hook.ctx)

    def add_hook(
        self,
        fn: HookFn,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        *,
        thread_only: bool = False,
        prepend: bool = False,
    ) -> _Hook:
        """Attach `fn` (first of this point's hooks with `prepend`, else last); with `thread_only`
        it fires only in the calling thread's passes."""
        if not callable(fn):
            raise TypeError(f"add_hook: fn must be callable, got {type(fn).__name__}")
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"add_hook: dir must be 'fwd' or 'bwd', got {dir!r}")
        handle = _Hook(fn, is_permanent, owner=threading.get_ident() if thread_only else None)
        hooks = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        if prepend:
            hooks.insert(0, handle)
        else:
            hooks.append(handle)
        return handle

    def remove(self, handle: _Hook) -> None:
        """Remove one hook, by the handle `add_hook` returned."""
        handle.active = False
        for hooks in (self.fwd_hooks, self.bwd_hooks):
            if handle in hooks:
                hooks.remove(handle)

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = False) -> None:
        """Remove the hooks of direction `dir`; permanent ones only with `including_permanent`."""
        for d in ("fwd", "bwd"):
            if dir not in (d, "both"):
                continue
            hooks = self.fwd_hooks if d == "fwd" else self.bwd_hooks
            for h in [h for h in hooks if including_permanent or not h.is_permanent]:
                self.remove(h)

    def clear_context(self) -> None:
        """Empty `ctx`, the state hooks kept here."""
        self.ctx = {}

    def layer(self) -> int:
        """The layer this hook point belongs to (`blocks.3.attn.hook_z` -> 3), as in transformer-lens."""
        parts = self.name.split(".")
        if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
            raise ValueError(f"hook point {self.name!r} belongs to no layer (only blocks.L.* hook points do)")
        return int(parts[1])

    @staticmethod
    def _mine(hooks: list[_Hook]) -> list[_Hook]:
        """The hooks that fire in the calling thread: its own, and those of no thread."""
        me = threading.get_ident()
        return [h for h in hooks if h.owner is None or h.owner == me]

    @property
    def has_hooks(self) -> HasHooks | _NoHooks:
        """Whether a hook would fire here in the calling thread (fast paths skip this point if not).

        Read as a truth value (`if hp.has_hooks:`), or called as transformer-lens' method
        `hp.has_hooks(dir="both", including_permanent=True)`.
        """
        if not self.fwd_hooks and not self.bwd_hooks:  # the common case, asked several times a layer
            return _NO_HOOKS
        return HasHooks(self)

    def forward(self, x: Tensor) -> Tensor:
        """`x` unchanged when no hook is attached; else what the hooks make of it, in order."""
        # The fast path: an idle hook point is a single attribute check.
        if not self.fwd_hooks and not self.bwd_hooks:
            return x
        for h in self._mine(self.fwd_hooks):
            out = h.fn(x, hook=self)
            if out is None:
                continue
            if not isinstance(out, Tensor):
                raise TypeError(
                    f"hook {_fn_name(h.fn)} on {self.name} returned {type(out).__name__}; "
                    "a hook must return None or a Tensor"
                )
            if out.shape != x.shape or out.dtype != x.dtype:
                raise ValueError(
                    f"hook {_fn_name(h.fn)} on {self.name} returned shape {tuple(out.shape)} and dtype "
                    f"{out.dtype}, but the activation has shape {tuple(x.shape)} and dtype {x.dtype}"
                )
            x = out
        if self.bwd_hooks and x.requires_grad:
            for h in self._mine(self.bwd_hooks):  # chosen now, in the forward's thread
                x.register_hook(_grad_hook(h, self))
        return x


class HasHooks:
    """`HookPoint.has_hooks`: true when a hook would fire in the calling thread; called, transformer-lens'
    `has_hooks(dir, including_permanent, level)` (hooks of other threads' contexts do not count)."""

    __slots__ = ("hook_point",)

    def __init__(self, hook_point: HookPoint | None) -> None:
        self.hook_point = hook_point

    def __call__(
        self,
        dir: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = True,
        level: int | None = None,
    ) -> bool:
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"has_hooks: dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        if level is not None:
            raise ValueError(
                f"has_hooks: level={level!r}: context levels are not tracked here (every `with model.hooks()` "
                "removes exactly the hooks it added); pass level=None"
            )
        hp = self.hook_point
        if hp is None:
            return False
        hooks = (hp.fwd_hooks if dir != "bwd" else []) + (hp.bwd_hooks if dir != "fwd" else [])
        return any(including_permanent or not h.is_permanent for h in HookPoint._mine(hooks))

    def __bool__(self) -> bool:
        hp = self.hook_point
        return hp is not None and bool(HookPoint._mine(hp.fwd_hooks) or HookPoint._mine(hp.bwd_hooks))

    def __eq__(self, other: object) -> bool:  # `hp.has_hooks == True` reads as the truth value
        return bool(self) == other

    def __hash__(self) -> int:
        return hash(bool(self))

    def __repr__(self) -> str:
        return repr(bool(self))


class _NoHooks(int):
    """`has_hooks` of an idle hook point: an int 0, so the fast paths' truth test costs no Python call,
    and callable like the method (always False)."""

    __slots__ = ()

    def __call__(
        self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = True, level: int | None = None
    ) -> bool:
        return HasHooks(None)(dir, including_permanent, level)  # checks the arguments; False

    def __repr__(self) -> str:
        return "False"


_NO_HOOKS = _NoHooks(0)


def _grad_hook(h: _Hook, hook_point: HookPoint) -> Callable[[Tensor], Tensor | None]:
    def call(grad: Tensor) -> Tensor | None:
        return h.fn(grad, hook=hook_point) if h.active else None

    return call


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


class HookedModule(nn.Module):
    """Base class that finds its `HookPoint`s and manages the functions on them.

    Subclasses call `self.setup_hooks()` at the end of `__init__`.
    """

    hook_dict: dict[str, HookPoint]

    def setup_hooks(self) -> None:
        """Name every HookPoint after its module path and index them in `hook_dict`."""
        self.hook_dict = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module
        # Every hook point, including any a subclass hides from hook_dict, for reset_hooks.
        self._all_hook_points = list(self.hook_dict.values())
        self._hook_names = list(self.hook_dict)

    @property
    def mod_dict(self) -> dict[str, nn.Module]:
        """Every submodule by name (transformer-lens' `mod_dict`), hook points included."""
        return {name: module for name, module in self.named_modules() if name}

    # ----- name resolution -------------------------------------------------
    def _unknown_hook_error(self, name: str) -> KeyError:
        msg = f"no hook point named {name!r}"
        m = re.match(r"blocks\.(-?\d+)\.", name)
        layers = sorted({int(k.split(".")[1]) for k in self.hook_dict if k.startswith("blocks.")})
        if m and layers and int(m.group(1)) not in layers:
            msg += f": layer {m.group(1)} is out of range, layers are {layers[0]}..{layers[-1]}"
        else:
            close = difflib.get_close_matches(name, self._hook_names, n=3, cutoff=0.6)
            if close:
                msg += f"; did you mean {' or '.join(repr(c) for c in close)}?"
            else:
                msg += "; see model.hook_dict for the names"
        return KeyError(msg)

    def hook_points(self, name_or_filter: NameFilter = None, arg: str = "name") -> list[HookPoint]:
        """The hook points a name, a list of names, a predicate or None (all, transformer-lens' `hook_points()`) selects."""
        if name_or_filter is None:
            return list(self.hook_dict.values())
        if isinstance(name_or_filter, str):
            if name_or_filter not in self.hook_dict:
                raise self._unknown_hook_error(name_or_filter)
            return [self.hook_dict[name_or_filter]]
        if callable(name_or_filter):
            return [hp for name, hp in self.hook_dict.items() if name_or_filter(name)]
        if isinstance(name_or_filter, Iterable):
            names = list(name_or_filter)
            bad = [n for n in names if not isinstance(n, str)]
            if bad:
                raise TypeError(f"{arg}: expected hook names (str), got {bad[0]!r}")
            return [hp for n in dict.fromkeys(names) for hp in self.hook_points(n, arg)]
        raise TypeError(
            f"{arg}: expected a hook name, a list of names, a callable filter or None; "
            f"got {type(name_or_filter).__name__}"
        )

    # ----- adding and removing ---------------------------------------------
    def add_hook(
        self,
        name: str | Callable[[str], bool],
        hook: HookFn,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        *,
        thread_only: bool = False,
        prepend: bool = False,
    ) -> list[tuple[HookPoint, _Hook]]:
        """Attach `hook` to the hook point `name` (or to every name a filter accepts).

        Returns handles that `remove_handles` takes. Non-permanent hooks go with
        `reset_hooks()`; permanent ones only with `reset_hooks(including_permanent=True)`.
        The hook fires in every thread's passes, or with `thread_only` in the calling
        thread's alone (as the hooks of `hooks()` and `run_with_*` do; see the module's docs).
        With `prepend` it runs before the hooks already on the point.
        """
        points = self.hook_points(name)
        return [
            (hp, hp.add_hook(hook, dir=dir, is_permanent=is_permanent, thread_only=thread_only, prepend=prepend))
            for hp in points
        ]

    def add_perma_hook(
        self, name: str | Callable[[str], bool], hook: HookFn, dir: Literal["fwd", "bwd"] = "fwd"
    ) -> list[tuple[HookPoint, _Hook]]:
        """`add_hook(name, hook, dir, is_permanent=True)`: survives `reset_hooks()` (transformer-lens' name)."""
        return self.add_hook(name, hook, dir=dir, is_permanent=True)

    def remove_handles(self, handles: Iterable[tuple[HookPoint, _Hook]]) -> None:
        """Remove the hooks `add_hook` returned (pairs of hook point and handle)."""
        for hp, h in handles:
            hp.remove(h)

    def reset_hooks(self, including_permanent: bool = False, *, clear_contexts: bool = True) -> None:
        """Remove every hook (permanent ones too if `including_permanent`) and, as transformer-lens
        does by default, empty every hook point's `ctx`."""
        for hp in self._all_hook_points:
            hp.remove_hooks("both", including_permanent=including_permanent)
        if clear_contexts:
            self.clear_contexts()

    def clear_contexts(self) -> None:
        """Empty every hook point's `ctx` (the state hooks keep between calls)."""
        for hp in self._all_hook_points:
            hp.clear_context()

    @contextmanager
    def hooks(
        self,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
        reset_hooks_end: bool = True,
    ) -> Iterator[HookedModule]:
        """Context in which the given hooks are attached; they go when it exits.

        Contexts nest: leaving an inner one removes only the hooks it added. The hooks fire
        only in this thread's passes (another thread using the model never sees them).

        Example:
            >>> def fn(resid, hook):       # transformer-lens' signature; may return a replacement
            ...     return resid * 0.5
            >>> with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", fn)]):
            ...     logits = model(tokens)
        """
        handles: list[tuple[HookPoint, _Hook]] = []
        try:
            for spec, direction in [(s, "fwd") for s in fwd_hooks] + [(s, "bwd") for s in bwd_hooks]:
                if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
                    raise TypeError(f"{direction}_hooks: each entry must be (name_or_filter, fn), got {spec!r}")
                handles += self.add_hook(spec[0], spec[1], dir=direction, thread_only=True)  # type: ignore[arg-type]
            yield self
        finally:
            if reset_hooks_end:
                self.remove_handles(handles)

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
        reset_hooks_end: bool = True,
        **model_kwargs: Any,
    ) -> Any:
        """Run the model with hooks attached for this call only.

        Example:
            >>> def zero_head_3(z, hook):
            ...     z[:, :, 3] = 0.0
            >>> logits = model.run_with_hooks("Hello", fwd_hooks=[("blocks.1.attn.hook_z", zero_head_3)])
        """
        if bwd_hooks and reset_hooks_end:
            warnings.warn(
                "run_with_hooks: backward hooks are removed when the call returns, before any "
                ".backward(); pass reset_hooks_end=False or use `with model.hooks(...)`",
                stacklevel=2,
            )
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end):
            return self(*model_args, **model_kwargs)

    def run_with_cache(
        self,
        *model_args: Any,
        names_filter: NameFilter = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        reset_hooks_end: bool = True,
        pos_slice: Any = None,
        **model_kwargs: Any,
    ) -> tuple[Any, Any]:
        """Run the model and return `(output, cache)` with the activations `names_filter` selects.

        `names_filter`: None (every hook), a name, a list of names, or a predicate on names.
        `device` / `dtype`: where and in which dtype to store the cached tensors.
        `incl_bwd`: also cache gradients (as `name + "_grad"`); the output must be a scalar
        (use `return_type="loss"`), on which `.backward()` is called.
        `pos_slice`: store only these positions of each activation (as transformer-lens: a `Slice`
        or what it takes; an int keeps the position axis). The query axis of patterns and scores.

        Example:
            >>> logits, cache = model.run_with_cache("Hello world")
            >>> cache["pattern", 0].shape   # [batch, head, query_pos, key_pos]
        """
        from .cache import ActivationCache

        points = self.hook_points(names_filter, arg="names_filter")
        if not points:
            raise ValueError(f"names_filter={names_filter!r} matches no hook point; see model.hook_dict for the names")
        store: dict[str, Tensor] = {}
        positions = None
        if pos_slice is not None:
            slice_index(pos_slice, "pos_slice")  # a bad one fails here, by name
            positions = Slice.unwrap(pos_slice)

        def save(name: str) -> HookFn:
            def fn(t: Tensor, hook: HookPoint) -> None:
                t = t.detach()
                if remove_batch_dim:
                    t = t[0]
                if positions is not None:
                    t = positions.apply(t, _pos_axis(name, t.ndim + int(remove_batch_dim)))
                store[name] = t.to(device=device, dtype=dtype) if (device or dtype) else t

            return fn

        fwd = [(hp.name, save(hp.name)) for hp in points]
        bwd = [(hp.name, save(hp.name + "_grad")) for hp in points] if incl_bwd else []
        explicit = _EXPLICIT.set(True)  # the same path whichever hooks are cached (see explicit_paths)
        try:
            with self.hooks(fwd, bwd, reset_hooks_end):  # type: ignore[arg-type]
                out = self(*model_args, **model_kwargs)
                if incl_bwd:
                    if not (isinstance(out, Tensor) and out.numel() == 1):
                        raise ValueError(
                            "run_with_cache(incl_bwd=True) needs a scalar output to call backward() on; "
                            "pass return_type='loss'"
                        )
                    out.backward()
        finally:
            _EXPLICIT.reset(explicit)
        # The order in which the activations were made (as transformer-lens' cache), then the gradients in that order.
        made = {name: i for i, name in enumerate(n for n in store if not n.endswith("_grad"))}
        ordered = dict(
            sorted(store.items(), key=lambda kv: (kv[0].endswith("_grad"), made.get(kv[0].removesuffix("_grad"), 0)))
        )
        return out, ActivationCache(ordered, self, has_batch_dim=not remove_batch_dim)


class HookedRootModule(HookedModule):
    """transformer-lens' base class for a hooked module of your own: declare `HookPoint`s in `__init__`,
    call `self.setup()` at its end (it names every hook point by its module path and builds `hook_dict`),
    and the module has `run_with_hooks`, `run_with_cache`, `hooks()`, `add_hook` and `reset_hooks`.

    Example (transformer-lens' Main Demo):
        >>> class SquareThenAdd(nn.Module):
        ...     def __init__(self, offset):
        ...         super().__init__()
        ...         self.offset = nn.Parameter(torch.tensor(offset))
        ...         self.hook_square = HookPoint()
        ...     def forward(self, x):
        ...         return self.offset + self.hook_square(x * x)
        >>> class TwoLayerModel(HookedRootModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layer1, self.layer2 = SquareThenAdd(3.0), SquareThenAdd(-4.0)
        ...         self.hook_in, self.hook_mid, self.hook_out = HookPoint(), HookPoint(), HookPoint()
        ...         self.setup()
        ...     def forward(self, x):
        ...         return self.hook_out(self.layer2(self.hook_mid(self.layer1(self.hook_in(x)))))
        >>> out, cache = TwoLayerModel().run_with_cache(torch.tensor(5.0))
        >>> out.item(), list(cache)
        (780.0, ['hook_in', 'layer1.hook_square', 'hook_mid', 'layer2.hook_square', 'hook_out'])
    """

    def setup(self) -> None:
        """Find the hook points, name them and build `hook_dict` (transformer-lens' name for `setup_hooks`)."""
        self.setup_hooks()


def _pos_axis(name: str, ndim: int) -> int:
    """The position axis, counted from the end, of hook `name`'s activation (`ndim` axes with batch).

    Axis 1 ([batch, pos, ...]), or the query axis of a pattern or its scores ([batch, head, q, k]).
    transformer-lens slices axis -3 of q/k/v/z/result and -2 of the rest: the same axes on every
    hook it has by default; its per-head LayerNorm inputs and hook_tokens would have their head or
    batch axis cut that way, where here they too are cut along their positions.
    """
    return (2 if name.removesuffix("_grad").endswith(("hook_pattern", "hook_attn_scores")) else 1) - ndim
