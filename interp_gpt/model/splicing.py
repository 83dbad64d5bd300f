"""Splicing modules into the model: an SAE, a transcoder, anything that reads an activation and returns
a replacement. GPT's `add_sae`, `reset_saes`, `saes(...)`, `run_with_saes`, `run_with_cache_with_saes`,
`run_with_hooks_with_saes`, `acts_to_saes` (transformer-lens' HookedSAETransformer names) and
`transcoders(...)`.

A spliced module reads the activation at its *read* hook and replaces the activation at its *write*
hook with its output (one hook for an SAE; `blocks.L.ln2.hook_normalized` -> `blocks.L.hook_mlp_out`
for a per-layer transcoder). While spliced, the write hook point is a `SplicedHookPoint` that keeps its
name and hooks and passes the activation through the module, whose hook points join `model.hook_dict`:

    blocks.1.hook_resid_pre                      the model's activation (hooks here run first, then the module)
    blocks.1.hook_resid_pre.hook_sae_input       ... the module's inner hook points, in its hook_names order
    blocks.1.hook_resid_pre.hook_sae_error       x - the clean replacement   (use_error_term=True only)
    blocks.1.hook_resid_pre.hook_sae_output      what flows downstream

The module's parameters stay out of the model's state_dict and parameters(). A read hook other than the
write hook keeps its output, per thread and per pass, for the modules that read it later in the pass.
With `use_error_term=True` the output is `x + (x_hat - x_hat_clean)` (x bit for bit while no hook
changes anything; gradients reach x through x_hat only, as in sae-lens). What a module must provide is
the `Spliceable` protocol (duck-typed; `interp_gpt.sae.SAE` follows it). Spliced modules act in every
thread's passes until removed.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor, nn

from ..hooks import HasHooks, HookPoint

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["Spliceable", "SplicedHookPoint", "SplicingMixin"]

_OWN = ("hook_sae_error", "hook_sae_output")  # the points the mechanism runs; the module runs the rest
_STATE = "splice_state"  # a frame's key for the dicts of modules sharing a splice_state


class Spliceable(Protocol):
    """A module the mechanism can splice in (duck-typed, no base class needed):

        splice_hooks(model, arg) -> (read, write)   the hook it reads and the hook it replaces, once it is
                                                     known to fit `model`; refuses by name (TypeError,
                                                     ValueError, KeyError) what does not fit, naming `arg`
        splice_forward(x, hooked=True) -> Tensor     its replacement for the write hook's activation, from the
                                                     read hook's `x`: through its inner hook points (all but
                                                     the two below) if hooked, past every one if not, with the
                                                     same arithmetic (the clean pass of the error term)
        hook_sae_error, hook_sae_output: HookPoint   the error term and the output pass through them
        hook_names: tuple[str, ...]                  the attribute names of all its hook points (those two
                                                     included); spliced, each is renamed "<write>.<name>"
        dtype, device                                must equal the model's
        extra_repr() -> str                          what error messages and repr show of it

    and, optionally (a module whose parts share what they compute in a pass: a cross-layer transcoder):

        splice_parts() -> Sequence[Spliceable]       splice these instead of the module itself
        splice_state: object                         modules with the same `splice_state` share one dict per
                                                     pass, given to splice_forward as `state=`
        splice_has_hooks() -> bool                   whether a hook could change its output (default: one
                                                     of its inner hook points has hooks)
    """

    hook_sae_error: HookPoint
    hook_sae_output: HookPoint

    @property
    def hook_names(self) -> tuple[str, ...]: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...
    def splice_hooks(self, model: Any, arg: str) -> tuple[str, str]: ...
    def splice_forward(self, x: Tensor, hooked: bool = True) -> Tensor: ...
    def extra_repr(self) -> str: ...


class _SplicedHasHooks(HasHooks):
    """`has_hooks` of a spliced point: always true as a truth value (a module runs there, or reads its
    output); called as transformer-lens' method it answers for the hooks users attached."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True


class _Reads:
    """The activations at read hooks, kept for the spliced modules that read them later in the pass.

    One stack of frames per thread: the model's forward pushes a frame on entry and pops it on exit,
    an error included (`enter` / `leave`, torch module hooks), so a nested pass has its own and a
    failed pass leaves nothing behind. The bottom frame serves passes run past `model(...)`; a value
    goes when its last reader has taken it.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _frames(self) -> list[dict[Any, list[Any]]]:
        frames = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = [{}]
        return frames

    def enter(self, *_: Any) -> None:
        self._frames().append({})

    def leave(self, *_: Any) -> None:
        frames = self._frames()
        if len(frames) > 1:
            frames.pop()

    def clear(self) -> None:
        """Drop every thread's frames (when no hook is read any more)."""
        self._local = threading.local()

    def state(self, key: object) -> dict[Any, Any]:
        """The dict the modules sharing `key` (their `splice_state`) keep for this pass."""
        return self._frames()[-1].setdefault((_STATE, id(key)), [{}, key])[0]  # key kept: its id stays its own

    def put(self, name: str, x: Tensor, readers: int) -> None:
        self._frames()[-1][name] = [x, readers]

    def take(self, name: str, reader: str) -> Tensor:
        frame = self._frames()[-1]
        entry = frame.get(name)
        if entry is None:
            raise ValueError(
                f"the module spliced in at {reader!r} reads {name!r}, which did not run before it in this "
                "forward pass (does the pass start after it, or is the read hook downstream of the write hook?)"
            )
        entry[1] -= 1
        if entry[1] <= 0:
            del frame[name]
        return entry[0]

    def __deepcopy__(self, memo: dict[int, Any]) -> _Reads:  # threading.local neither copies nor pickles
        return _Reads()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (_Reads, ())


class SplicedHookPoint(HookPoint):
    """A model hook point the mechanism took over: its own hooks first (it shares the hook lists of the
    point it replaces, so handles taken on either keep working), then the spliced `module` (if any)
    replaces the activation, then, if later modules read it (`readers`), it keeps what flows on.

    `reads`: the read hook of `module` when it is not this one (None: it reads this activation).
    """

    def __init__(
        self,
        original: HookPoint,
        sae: Spliceable | None = None,
        use_error_term: bool = False,
        *,
        reads: str | None = None,
        store: _Reads | None = None,
    ) -> None:
        super().__init__()
        self.name = original.name
        self.fwd_hooks = original.fwd_hooks
        self.bwd_hooks = original.bwd_hooks
        self.ctx = original.ctx
        object.__setattr__(self, "original", original)  # plain attributes: not submodules, so the
        object.__setattr__(self, "module", sae)  # module's parameters stay out of the model's state_dict
        object.__setattr__(self, "store", store if store is not None else _Reads())
        self.use_error_term = bool(use_error_term)
        self.reads = reads
        self.readers = 0  # how many spliced modules read this point's output (set by the mixin)
        self._inner: tuple[str, ...] = ()
        self._names: dict[str, str | None] = {}  # the module's own names of its hook points, given back on release
        if sae is not None:
            self._names = {n: getattr(sae, n).name for n in sae.hook_names}
            self._inner = tuple(n for n in sae.hook_names if n not in _OWN)
            for name in self._inner + (_OWN if use_error_term else _OWN[1:]):  # pass order
                self.add_module(name, getattr(sae, name))

    original: HookPoint
    module: Spliceable | None
    store: _Reads

    @property
    def sae(self) -> Any:
        """The spliced module (an SAE, a transcoder); None where the point is only read."""
        return self.module

    @property
    def has_hooks(self) -> HasHooks:
        return _SplicedHasHooks(self)  # true: the model's fast paths must call this point, a module runs here

    def forward(self, x: Tensor) -> Tensor:
        x = super().forward(x)  # the hooks on the model's own point (a patch, a cache) act first
        if self.module is not None:
            x = self._replace(x)
        if self.readers:
            self.store.put(self.name, x, self.readers)
        return x

    def _replace(self, x: Tensor) -> Tensor:
        m = self.module
        assert m is not None
        source = x if self.reads is None else self.store.take(self.reads, self.name)
        key = getattr(m, "splice_state", None)
        kw: dict[str, Any] = {} if key is None else {"state": self.store.state(key)}
        recons = m.splice_forward(source, **kw)
        if self.use_error_term:
            with torch.no_grad():
                if self._hooked(m):
                    clean = m.splice_forward(source, hooked=False, **kw)
                else:  # nothing could have changed the pass: it was the clean one
                    clean = recons.detach()
            base = x.detach().to(recons.dtype)
            error_point: HookPoint = m.hook_sae_error
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
        return m.hook_sae_output(out)

    def _hooked(self, m: Spliceable) -> bool:
        """Whether a hook could have changed m's output (then the error term needs the clean pass)."""
        asked = getattr(m, "splice_has_hooks", None)
        if callable(asked):
            return bool(asked())
        return any(getattr(m, n).has_hooks for n in self._inner)

    def extra_repr(self) -> str:
        if self.module is None:
            return f"{self.name}, read by {self.readers} spliced module(s)"
        reads = "" if self.reads is None else f", reads={self.reads!r}"
        return f"{self.name}, sae={self.module.extra_repr()}, use_error_term={self.use_error_term}{reads}"


def _parts(sae: Any) -> list[Any]:
    """What splicing `sae` splices: its `splice_parts()` where it has them (a CLT's layers), else itself."""
    parts = getattr(sae, "splice_parts", None)
    return list(parts()) if callable(parts) else [sae]


class SplicingMixin:
    """GPT's splicing: `add_sae`, `reset_saes`, `saes(...)`, `run_with_saes`, `run_with_cache_with_saes`,
    `run_with_hooks_with_saes`, `acts_to_saes` (transformer-lens' HookedSAETransformer API), and
    `transcoders(...)`. Each takes any module with the protocol of the module's docs."""

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
    def acts_to_saes(self) -> dict[str, Any]:
        """The spliced modules (SAEs, transcoders) by the hook name they write (transformer-lens' name)."""
        return {hp.name: hp.module for hp in self._spliced_points() if hp.module is not None}

    def _spliced_points(self) -> list[SplicedHookPoint]:
        return [hp for hp in getattr(self, "_all_hook_points", []) if isinstance(hp, SplicedHookPoint)]

    def _reads(self) -> _Reads:
        store = self.__dict__.get("_splice_reads")
        if store is None:
            store = self.__dict__["_splice_reads"] = _Reads()
        return store

    def _check_splice(self, sae: Any, use_error_term: Any, arg: str = "sae") -> tuple[str, str]:
        """(read, write) of `sae`, checked against this model, the splice's other arguments too."""
        if not callable(getattr(sae, "splice_hooks", None)):
            raise TypeError(
                f"{arg}: expected an interp_gpt.sae.SAE, got {type(sae).__name__} (or any module with "
                "splice_hooks(model, arg) and splice_forward(x, hooked): see interp_gpt.model.splicing)"
            )
        read, write = sae.splice_hooks(self, arg)
        for role, name in (("reads", read), ("writes", write)):
            if name not in self.hook_dict:
                raise KeyError(f"{arg} {role} {name!r}: {self._unknown_hook_error(str(name)).args[0]}")
            inside = [hp.name for hp in self._spliced_points() if name.startswith(hp.name + ".")]
            if inside:
                raise ValueError(f"{arg} {role} {name!r}, a hook point of the module spliced in at {inside[0]!r}")
        layers = [int(n.split(".")[1]) if n.startswith("blocks.") else None for n in (read, write)]
        if None not in layers and layers[0] > layers[1]:  # type: ignore[operator]
            raise ValueError(f"{arg} reads {read!r} after it writes {write!r}: a module reads a hook upstream")
        if not isinstance(use_error_term, bool):
            raise TypeError(f"use_error_term: expected True or False, got {use_error_term!r}")
        p = next(iter(self.parameters()), None)
        if p is not None and (sae.dtype != p.dtype or sae.device != p.device):
            raise ValueError(
                f"{arg} is {sae.dtype} on {sae.device} but the model is {p.dtype} on {p.device}: "
                f"use {arg}.to({p.dtype}, {str(p.device)!r}) (or load it with dtype= and device=)"
            )
        owner = getattr(sae, "_spliced_in", None)
        if owner is not None and owner is not self.hook_dict[write]:
            raise ValueError(
                f"this {type(sae).__name__} is already spliced in at {owner.name!r} (of this or another model); "
                f"take it out first (reset_saes), or splice a copy (copy.deepcopy({arg}))"
            )
        return read, write

    def add_sae(self, sae: Spliceable, use_error_term: bool | None = False) -> None:
        """Splice `sae` (an SAE, or any module with the splicing protocol: a transcoder) in at the hook
        it writes (an SAE's `cfg.metadata.hook_name`), replacing any module already there.

        `use_error_term=True` adds back the module's error, so the model computes exactly what it
        computes without it while the features are still there to read, patch and differentiate.

        Example:
            >>> model.add_sae(sae)
            >>> _, cache = model.run_with_cache("Hello")
            >>> cache["blocks.1.hook_resid_pre.hook_sae_acts_post"].shape   # [batch, pos, d_sae]
        """
        parts = _parts(sae)
        error_term = False if use_error_term is None else use_error_term
        for part in parts[:-1]:  # every part checked before the first goes in: all of them, or none
            self._check_splice(part, error_term)
        for part in parts:
            self._splice(part, error_term)

    def _splice(self, sae: Spliceable, use_error_term: bool, arg: str = "sae") -> str:
        read, write = self._check_splice(sae, use_error_term, arg)
        current = self.hook_dict[write]
        original = current.original if isinstance(current, SplicedHookPoint) else current
        if isinstance(current, SplicedHookPoint) and current.module is not None:
            self._release(current)
        spliced = SplicedHookPoint(
            original, sae, use_error_term, reads=None if read == write else read, store=self._reads()
        )
        self._put(write, spliced)
        object.__setattr__(sae, "_spliced_in", spliced)
        self._update_reads()
        return write

    def _put(self, name: str, point: HookPoint) -> None:
        parent_name, _, attr = name.rpartition(".")
        parent = self.get_submodule(parent_name) if parent_name else self
        setattr(parent, attr, point)

    def _release(self, point: SplicedHookPoint) -> None:
        """The module spliced at `point` gets its own hook names back and is free to splice again."""
        assert point.module is not None
        for n in point.module.hook_names:
            getattr(point.module, n).name = point._names.get(n) or n
        if getattr(point.module, "_spliced_in", None) is point:
            object.__setattr__(point.module, "_spliced_in", None)

    def _update_reads(self) -> None:
        """Make every read hook a point that keeps its output (and give back those no longer read),
        hold the per-pass frames while any hook is read, then rebuild hook_dict."""
        self.setup_hooks()
        readers: dict[str, int] = {}
        for hp in self._spliced_points():
            if hp.module is not None and hp.reads is not None:
                readers[hp.reads] = readers.get(hp.reads, 0) + 1
        for hp in self._spliced_points():
            hp.readers = readers.get(hp.name, 0)
            if hp.module is None and not hp.readers:
                self._put(hp.name, hp.original)
        for name, n in readers.items():
            point = self.hook_dict[name]
            if not isinstance(point, SplicedHookPoint):
                reader = SplicedHookPoint(point, store=self._reads())
                reader.readers = n
                self._put(name, reader)
        handles = self.__dict__.pop("_splice_frames", None)
        shared = any(getattr(hp.module, "splice_state", None) is not None for hp in self._spliced_points())
        if readers or shared:  # the frames: pushed before the model's forward, popped after it, an error too
            store, model = self._reads(), cast(nn.Module, self)
            handles = handles or (
                model.register_forward_pre_hook(store.enter, prepend=True),
                model.register_forward_hook(store.leave, always_call=True),
            )
            self.__dict__["_splice_frames"] = handles
        else:
            for h in handles or ():
                h.remove()
            self._reads().clear()
        self.setup_hooks()

    def reset_saes(self, act_names: str | Sequence[str] | None = None) -> None:
        """Take out the modules written at `act_names` (all of them by default); the model is as before.

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
            self._release(point)
            self._put(n, point.original)
        self._update_reads()

    @contextmanager
    def saes(
        self,
        saes: Spliceable | Sequence[Spliceable] = (),
        reset_saes_end: bool = True,
        use_error_term: bool | None = None,
    ) -> Iterator[Any]:
        """Context in which `saes` are spliced in; on exit (an error too) the model is as it was,
        any module they displaced put back.

        Example:
            >>> with model.saes([sae], use_error_term=True):
            ...     logits, cache = model.run_with_cache(tokens)
        """
        one = any(callable(getattr(saes, m, None)) for m in ("splice_hooks", "splice_parts"))  # one, or a list
        modules: list[Any] = [p for sae in ([saes] if one else list(saes)) for p in _parts(sae)]  # type: ignore[arg-type]
        before = {hp.name: (hp.module, hp.use_error_term) for hp in self._spliced_points() if hp.module is not None}
        added: list[str] = []
        try:
            for sae in modules:
                added.append(self._splice(sae, bool(use_error_term)))
            yield self
        finally:
            if reset_saes_end:
                for n in dict.fromkeys(added):
                    if n in self.acts_to_saes:
                        self.reset_saes(n)
                    if n in before:
                        self._splice(before[n][0], use_error_term=before[n][1])  # type: ignore[arg-type]

    @contextmanager
    def transcoders(
        self, transcoders: Spliceable | Sequence[Spliceable] = (), use_error_term: bool = False
    ) -> Iterator[Any]:
        """Context in which `transcoders` replace the activations they write (a per-layer transcoder:
        `blocks.L.hook_mlp_out`, the MLP's output, from what it reads: `blocks.L.ln2.hook_normalized`);
        any module with the splicing protocol (see interp_gpt.model.splicing) is taken, a CrossLayerTranscoder
        too (every layer's MLP, each from the features of its own and the earlier layers). As `saes(...)`. A
        transcoder made for other weights than the model's (raw / processed) is converted exactly by its
        `splice_hooks`, or refused by name (see interp_gpt.sae.transcoder_processing).

        Example:
            >>> with model.transcoders(tcs, use_error_term=True):
            ...     _, cache = model.run_with_cache(tokens)   # cache["blocks.0.hook_mlp_out.hook_sae_acts_post"]
            >>> from interp_gpt.sae.data import shipped_clt
            >>> with model.transcoders(shipped_clt()):           # a CLT: layer 0's features decode into layer 1 too
            ...     logits = model(tokens)
        """
        with self.saes(transcoders, use_error_term=use_error_term):
            yield self

    def run_with_saes(
        self,
        *model_args: Any,
        saes: Spliceable | Sequence[Spliceable] = (),
        use_error_term: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """The model's output with `saes` spliced in for this call.

        Example:
            >>> logits = model.run_with_saes("Hello", saes=[sae])
        """
        with self.saes(saes, use_error_term=use_error_term):
            return self(*model_args, **kwargs)

    def run_with_cache_with_saes(
        self,
        *model_args: Any,
        saes: Spliceable | Sequence[Spliceable] = (),
        use_error_term: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """`run_with_cache` with `saes` spliced in for this call.

        Example:
            >>> logits, cache = model.run_with_cache_with_saes("Hello", saes=[sae])
        """
        with self.saes(saes, use_error_term=use_error_term):
            return self.run_with_cache(*model_args, **kwargs)

    def run_with_hooks_with_saes(
        self,
        *model_args: Any,
        saes: Spliceable | Sequence[Spliceable] = (),
        use_error_term: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """`run_with_hooks` with `saes` spliced in for this call.

        Example:
            >>> def fn(acts, hook):                  # read (or return a replacement of) the SAE's features
            ...     print(hook.name, tuple(acts.shape))
            >>> name = "blocks.1.hook_resid_pre.hook_sae_acts_post"
            >>> logits = model.run_with_hooks_with_saes("Hi", saes=[sae], fwd_hooks=[(name, fn)])
            blocks.1.hook_resid_pre.hook_sae_acts_post (1, 3, 1024)
        """
        with self.saes(saes, use_error_term=use_error_term):
            return self.run_with_hooks(*model_args, **kwargs)
