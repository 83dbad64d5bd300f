"""generate's arguments, and the key/value cache when a forward stops part-way."""

from __future__ import annotations

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.model import KVCache


def _model() -> GPT:
    model = GPT(Config(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=64))
    model.init_weights(0)
    return model.eval()


PROMPT = torch.randint(0, 99, (2, 6), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(top_k=True), TypeError, "top_k must be an int, got bool"),
        (dict(top_k=2.5), TypeError, "top_k must be an int"),
        (dict(top_p="0.5"), TypeError, "top_p must be a number, got str"),
        (dict(top_p=float("nan")), ValueError, "top_p=nan"),
        (dict(temperature="1"), TypeError, "temperature must be a number, got str"),
        (dict(temperature=float("inf")), ValueError, "temperature=inf"),
        (dict(seed="a"), TypeError, "seed must be an int, got str"),
        (dict(seed=-1), ValueError, "seed=-1 is out of range"),
        (dict(seed=2**64), ValueError, "seed=18446744073709551616 is out of range"),
        (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int"),
        (dict(eos_token_id=100), ValueError, r"eos_token_id=100 is out of range: token ids are 0\.\.99"),
        (dict(eos_token_id=-1), ValueError, "eos_token_id=-1"),
        (dict(do_sample="yes"), TypeError, "do_sample='yes'"),
    ],
)
def test_generate_refuses_arguments_of_the_wrong_type_or_range(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        _model().generate(PROMPT, **{"max_new_tokens": 2, "eos_token_id": 0, **kwargs})


class Boom(Exception):
    pass


@pytest.mark.parametrize("where", ["blocks.0.attn.hook_z", "blocks.1.hook_resid_post", "unembed.hook_out"])
@pytest.mark.parametrize("error", [Boom, KeyboardInterrupt])
def test_a_forward_cut_short_leaves_the_kv_cache_as_it_was(where: str, error: type[BaseException]) -> None:
    """Layer 0 has already extended its keys when a later hook raises: the cache must be put back,
    so the next step gives exactly the logits of an uninterrupted run."""
    model = _model()
    cache = KVCache(model.cfg.n_layers)
    with torch.no_grad():
        model(PROMPT, past_kv_cache=cache)
        before = (list(cache.keys), list(cache.values), cache.attention_mask)

        def fail(x, hook):  # type: ignore[no-untyped-def]
            raise error()

        nxt = PROMPT[:, :1]
        with pytest.raises(error):
            model.run_with_hooks(nxt, past_kv_cache=cache, fwd_hooks=[(where, fail)])
        assert cache.length == PROMPT.shape[1]
        assert all(a is b for a, b in zip(cache.keys + cache.values, before[0] + before[1], strict=True))
        assert cache.attention_mask is before[2]
        resumed = model(nxt, past_kv_cache=cache)
        full = model(torch.cat([PROMPT, nxt], dim=1))
    torch.testing.assert_close(resumed[:, -1], full[:, -1], atol=1e-5, rtol=1e-4)


def test_a_half_extended_kv_cache_is_refused_by_name() -> None:
    model = _model()
    cache = KVCache(model.cfg.n_layers)
    with torch.no_grad():
        model(PROMPT, past_kv_cache=cache)
        k0 = cache.keys[0]
        assert k0 is not None
        cache.keys[0] = torch.cat([k0, k0[:, :1]], dim=1)  # layer 0 one position ahead
        with pytest.raises(
            ValueError, match=r"past_kv_cache: its layers disagree \(positions per layer \[7, 6\], mask 6\)"
        ):
            model(PROMPT[:, :1], past_kv_cache=cache)
