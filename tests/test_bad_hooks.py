"""Hooks: a replacement of the wrong dtype is refused by name, and the thread rule holds."""

from __future__ import annotations

import threading

import pytest
import torch

from interp_gpt import GPT


def test_a_hook_returning_another_dtype_is_refused_naming_both(tiny_model: GPT, tiny_tokens) -> None:
    def to_double(x, hook):  # type: ignore[no-untyped-def]
        return x.double()

    with pytest.raises(ValueError, match=r"to_double on blocks\.0\.hook_resid_mid.*torch\.float64.*torch\.float32"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_resid_mid", to_double)])
    assert not any(hp.fwd_hooks for hp in tiny_model.hook_dict.values())  # and nothing is left behind


def _zero_embed(x, hook):  # type: ignore[no-untyped-def]
    return torch.zeros_like(x)


def _in_two_threads(model: GPT, tokens: torch.Tensor, attach) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Thread A attaches hooks with `attach` and holds them while thread B runs a plain forward;
    returns (A's output under its hooks, B's output)."""
    attached, b_done = threading.Event(), threading.Event()
    out: dict[str, torch.Tensor] = {}
    errors: list[BaseException] = []

    def a() -> None:
        try:
            with attach():
                attached.set()
                assert b_done.wait(60)
                out["a"] = model(tokens)
        except BaseException as e:  # report to the test thread
            errors.append(e)
            attached.set()

    def b() -> None:
        try:
            assert attached.wait(60)
            out["b"] = model(tokens)
        except BaseException as e:
            errors.append(e)
        finally:
            b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out["a"], out["b"]


def test_context_hooks_never_fire_in_another_threads_forward(tiny_model: GPT, tiny_tokens) -> None:
    plain = tiny_model(tiny_tokens)
    patched = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("hook_embed", _zero_embed)])
    assert not torch.allclose(plain, patched)
    a, b = _in_two_threads(tiny_model, tiny_tokens, lambda: tiny_model.hooks(fwd_hooks=[("hook_embed", _zero_embed)]))
    torch.testing.assert_close(a, patched, rtol=0, atol=0)  # A sees its hooks
    torch.testing.assert_close(b, plain, rtol=0, atol=0)  # B does not


def test_a_cache_in_one_thread_does_not_change_or_collect_another_threads_run(tiny_model: GPT, tiny_tokens) -> None:
    """run_with_cache's hooks (and the slow attention path they force) stay in their thread."""
    seen: list[str] = []
    plain = tiny_model(tiny_tokens)

    def spy(x, hook):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)

    _, b = _in_two_threads(tiny_model, tiny_tokens, lambda: tiny_model.hooks(fwd_hooks=[(lambda n: True, spy)]))
    torch.testing.assert_close(b, plain, rtol=0, atol=0)
    assert seen and set(seen) == {seen[0]}  # one thread's forward fed the spy, not both


def test_hooks_added_with_add_hook_fire_in_every_thread(tiny_model: GPT, tiny_tokens) -> None:
    patched = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("hook_embed", _zero_embed)])
    tiny_model.add_hook("hook_embed", _zero_embed, is_permanent=True)
    try:
        out: dict[str, torch.Tensor] = {}
        t = threading.Thread(target=lambda: out.update(b=tiny_model(tiny_tokens)))
        t.start()
        t.join(60)
        torch.testing.assert_close(out["b"], patched, rtol=0, atol=0)
    finally:
        tiny_model.reset_hooks(including_permanent=True)


def test_thread_only_hooks_are_removed_by_reset_hooks_from_any_thread(tiny_model: GPT) -> None:
    tiny_model.add_hook("hook_embed", _zero_embed, thread_only=True)
    t = threading.Thread(target=tiny_model.reset_hooks)
    t.start()
    t.join(60)
    assert not tiny_model.hook_dict["hook_embed"].fwd_hooks
