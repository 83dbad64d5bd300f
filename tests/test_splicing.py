"""The splicing mechanism (interp_gpt.model.splicing) with a module that reads one hook and writes another.

`TinyTranscoder` is a test-only module with the splicing protocol: it reads `blocks.0.ln2.hook_normalized`
(or `blocks.0.hook_resid_mid`) and replaces `blocks.0.hook_mlp_out` with its prediction, as a per-layer
transcoder does. Every expected value comes from plain hooks on the unspliced model.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from interp_gpt import GPT
from interp_gpt.hooks import HookPoint
from interp_gpt.model.splicing import SplicedHookPoint

LN2 = "blocks.0.ln2.hook_normalized"
MID = "blocks.0.hook_resid_mid"
OUT = "blocks.0.hook_mlp_out"
FEATS = OUT + ".hook_sae_acts_post"
NAMES = ("hook_sae_input", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error", "hook_sae_output")


class TinyTranscoder(nn.Module):
    """relu(x @ W_enc + b_enc) @ W_dec + b_dec, read at `read`, written at `write`."""

    def __init__(self, read: str = LN2, write: str = OUT, d: int = 64, d_hidden: int = 48, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W_enc = nn.Parameter(torch.randn(d, d_hidden, generator=g) * 0.3)
        self.b_enc = nn.Parameter(torch.randn(d_hidden, generator=g) * 0.1)
        self.W_dec = nn.Parameter(torch.randn(d_hidden, d, generator=g) * 0.3)
        self.b_dec = nn.Parameter(torch.randn(d, generator=g) * 0.1)
        self.read, self.write = read, write
        for name in NAMES:
            setattr(self, name, HookPoint())
            getattr(self, name).name = name

    hook_names = NAMES
    hook_sae_error: HookPoint
    hook_sae_output: HookPoint

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    def splice_hooks(self, model: Any, arg: str = "sae") -> tuple[str, str]:
        return self.read, self.write

    def splice_forward(self, x: Tensor, hooked: bool = True) -> Tensor:
        def hp(name: str) -> Any:
            return getattr(self, name) if hooked else (lambda t: t)

        x = hp("hook_sae_input")(x)
        acts = hp("hook_sae_acts_post")(torch.relu(x @ self.W_enc + self.b_enc))
        return hp("hook_sae_recons")(acts @ self.W_dec + self.b_dec)

    def predict(self, x: Tensor) -> Tensor:
        """The same maths, no hook points: the reference."""
        return torch.relu(x @ self.W_enc + self.b_enc) @ self.W_dec + self.b_dec


def observed(model: GPT, tokens: Tensor, *names: str, **kw: Any) -> Tensor:
    """The unspliced model's output with `names` watched (a no-op hook: LayerNorm takes its unfused path)."""
    return model.run_with_hooks(tokens, fwd_hooks=[(n, lambda x, hook: None) for n in names], **kw)


def substituted(model: GPT, tokens: Tensor, tc: TinyTranscoder, **kw: Any) -> Tensor:
    """Plain hooks: `tc.write` replaced by tc's prediction from `tc.read`, kept by a hook in a first pass (a
    hook, not run_with_cache: a cache computes every activation on the explicit path, see hooks.py)."""
    kept: dict[str, Tensor] = {}
    model.run_with_hooks(tokens, fwd_hooks=[(tc.read, lambda x, hook: kept.update(read=x.detach().clone()))])
    return model.run_with_hooks(tokens, fwd_hooks=[(tc.write, lambda x, hook: tc.predict(kept["read"]))], **kw)


# ----------------------------------------------------------------------------
# the error term and plain substitution
# ----------------------------------------------------------------------------
def test_with_the_error_term_the_logits_are_bit_identical(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    for read in (MID, LN2):
        tc = TinyTranscoder(read)
        with torch.no_grad(), tiny_model.transcoders([tc], use_error_term=True):
            spliced = tiny_model(tiny_tokens)
            _, cache = tiny_model.run_with_cache(tiny_tokens)
        with torch.no_grad():
            # reading resid_mid changes nothing; reading ln2's normalized vector takes ln2 off its fused
            # kernel, so the reference watches that hook too (and the two agree within float error)
            assert torch.equal(spliced, observed(tiny_model, tiny_tokens, read)), read
            torch.testing.assert_close(spliced, tiny_model(tiny_tokens), atol=1e-5, rtol=1e-5)
            _, plain = tiny_model.run_with_cache(tiny_tokens)  # every hook watched, as in `cache`
        for name in plain.keys():  # every activation of the model, bit for bit
            assert torch.equal(cache[name], plain[name]), name
        prediction = tc.predict(plain[read]).detach()
        assert (prediction - plain[OUT]).abs().max() > 0.1  # a bad prediction: the error term does the work
        torch.testing.assert_close(cache[OUT + ".hook_sae_recons"], prediction)
        torch.testing.assert_close(cache[OUT + ".hook_sae_input"], plain[read])
        torch.testing.assert_close(cache[OUT + ".hook_sae_error"], plain[OUT] - prediction, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cache[FEATS], torch.relu(plain[read] @ tc.W_enc + tc.b_enc).detach())
        assert torch.equal(cache[OUT + ".hook_sae_output"], plain[OUT])


def test_without_the_error_term_the_output_is_a_plain_substitution(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    for read in (LN2, MID):
        tc = TinyTranscoder(read)
        with torch.no_grad():
            want = substituted(tiny_model, tiny_tokens, tc)
            with tiny_model.transcoders(tc):
                got = tiny_model(tiny_tokens)
                got_forward = tiny_model.forward(tiny_tokens)  # past model(...): the bottom frame
            assert torch.equal(got, want) and torch.equal(got_forward, want), read
            assert (got - tiny_model(tiny_tokens)).abs().max() > 1e-2  # the transcoder did change the output


def test_ablating_a_feature_moves_the_output_by_its_decoder_row(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    tc = TinyTranscoder()
    seen: list[Tensor] = []
    with torch.no_grad(), tiny_model.transcoders(tc, use_error_term=True):
        _, cache = tiny_model.run_with_cache(tiny_tokens)
        f = int(cache[FEATS].sum((0, 1)).argmax())

        def ablate(acts: Tensor, hook: Any) -> None:
            acts[..., f] = 0.0

        tiny_model.run_with_hooks(
            tiny_tokens, fwd_hooks=[(FEATS, ablate), (OUT + ".hook_sae_output", lambda x, hook: seen.append(x.clone()))]
        )
    torch.testing.assert_close(seen[0], cache[OUT] - cache[FEATS][..., f, None] * tc.W_dec[f].detach(), atol=1e-5, rtol=1e-5)  # fmt: skip


def test_gradients_reach_the_read_hook_through_the_prediction(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    tc = TinyTranscoder()
    with tiny_model.transcoders(tc):
        _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=[LN2], return_type="loss", incl_bwd=True)
    kept: dict[str, Tensor] = {}

    def keep(x: Tensor, hook: Any) -> None:
        kept["x"] = x

    with tiny_model.hooks(fwd_hooks=[(LN2, keep), (OUT, lambda x, hook: tc.predict(kept["x"]))]):
        _, want = tiny_model.run_with_cache(tiny_tokens, names_filter=[LN2], return_type="loss", incl_bwd=True)
    torch.testing.assert_close(cache[LN2 + "_grad"], want[LN2 + "_grad"])
    assert cache[LN2 + "_grad"].abs().max() > 0


# ----------------------------------------------------------------------------
# the value read: per thread, per pass, dropped on error
# ----------------------------------------------------------------------------
def test_each_thread_reads_its_own_pass(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    """Two threads each stop between the read and the write; the first to have read writes first."""
    tc = TinyTranscoder()
    rows = {"a": tiny_tokens[:1], "b": tiny_tokens[1:]}
    with torch.no_grad():
        want = {k: substituted(tiny_model, t, tc) for k, t in rows.items()}
    paused = {k: threading.Event() for k in rows}
    go = {k: threading.Event() for k in rows}
    got: dict[str, Tensor] = {}

    def wait(x: Tensor, hook: Any) -> None:  # between ln2 (read) and hook_mlp_out (written)
        name = threading.current_thread().name
        if name in rows:
            paused[name].set()
            assert go[name].wait(10)

    def run(name: str) -> None:
        with torch.no_grad():
            got[name] = tiny_model(rows[name])

    tiny_model.add_hook("blocks.0.mlp.hook_pre", wait)
    threads = {k: threading.Thread(target=run, args=(k,), name=k) for k in rows}
    try:
        with tiny_model.transcoders(tc):
            threads["a"].start()
            assert paused["a"].wait(10)
            threads["b"].start()
            assert paused["b"].wait(10)
            go["a"].set()  # a writes while b's read is the latest
            threads["a"].join(10)
            go["b"].set()
            threads["b"].join(10)
    finally:
        for e in go.values():
            e.set()
        tiny_model.reset_hooks()
    assert torch.equal(got["a"], want["a"]) and torch.equal(got["b"], want["b"])


def test_a_pass_run_by_a_hook_reads_its_own(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    tc = TinyTranscoder()
    a, b = tiny_tokens[:1], tiny_tokens[1:]
    with torch.no_grad():
        want_a, want_b = substituted(tiny_model, a, tc), substituted(tiny_model, b, tc)
        inner: list[Tensor] = []
        depth = [0]

        def nested(x: Tensor, hook: Any) -> None:
            if depth[0] == 0:  # the outer pass runs the model once more, between its read and its write
                depth[0] += 1
                inner.append(tiny_model(b))

        with tiny_model.transcoders(tc), tiny_model.hooks(fwd_hooks=[("blocks.0.mlp.hook_pre", nested)]):
            outer = tiny_model(a)
    assert torch.equal(outer, want_a) and torch.equal(inner[0], want_b)


def test_a_failed_pass_keeps_nothing(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    tc = TinyTranscoder()
    refs: list[weakref.ref[Tensor]] = []

    def boom(x: Tensor, hook: Any) -> None:
        raise RuntimeError("boom")

    with tiny_model.transcoders(tc):
        with tiny_model.hooks(fwd_hooks=[(LN2, lambda x, hook: refs.append(weakref.ref(x))), ("blocks.0.mlp.hook_pre", boom)]):  # fmt: skip
            with pytest.raises(RuntimeError, match="boom"):
                tiny_model(tiny_tokens)
        gc.collect()
        assert refs and refs[0]() is None  # the value read was dropped with the pass
        with torch.no_grad():
            assert torch.equal(tiny_model(tiny_tokens), substituted(tiny_model, tiny_tokens, tc))


# ----------------------------------------------------------------------------
# with SAEs: a module reads what flows on at its read hook; removal leaves the model as it was
# ----------------------------------------------------------------------------
def test_a_transcoder_reads_the_output_of_an_sae_at_its_read_hook(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    sae = TinyTranscoder(LN2, LN2, seed=1)  # an SAE-like module: reads and writes ln2's normalized vector
    tc = TinyTranscoder()
    names, state, modules = list(tiny_model.hook_dict), set(tiny_model.state_dict()), dict(tiny_model.named_modules())
    kept: dict[str, Tensor] = {}

    def sae_then_keep(x: Tensor, hook: Any) -> Tensor:
        kept["x"] = sae.predict(x)
        return kept["x"]

    with torch.no_grad():
        want = tiny_model.run_with_hooks(
            tiny_tokens, fwd_hooks=[(LN2, sae_then_keep), (OUT, lambda x, hook: tc.predict(kept["x"]))]
        )
        with tiny_model.saes([sae, tc]):
            assert tiny_model.acts_to_saes == {LN2: sae, OUT: tc}
            assert set(tiny_model.state_dict()) == state
            assert torch.equal(tiny_model(tiny_tokens), want)
            tiny_model.reset_saes(LN2)  # the transcoder still reads there
            assert isinstance(tiny_model.hook_dict[LN2], SplicedHookPoint) and tiny_model.acts_to_saes == {OUT: tc}
            assert torch.equal(tiny_model(tiny_tokens), substituted(tiny_model, tiny_tokens, tc))
    assert list(tiny_model.hook_dict) == names and tiny_model.acts_to_saes == {}
    assert not any(isinstance(hp, SplicedHookPoint) for hp in tiny_model.hook_dict.values())
    assert dict(tiny_model.named_modules()).keys() == modules.keys()
    assert not tiny_model._forward_hooks and not tiny_model._forward_pre_hooks  # the frames' hooks went too
    assert tc.hook_sae_acts_post.name == "hook_sae_acts_post"


def test_hook_names_while_spliced(tiny_model: GPT, tiny_tokens: Tensor) -> None:
    tc = TinyTranscoder()
    with tiny_model.transcoders(tc, use_error_term=True):
        spliced = [n for n in tiny_model.hook_dict if n.startswith(OUT + ".")]
        assert spliced == [OUT + "." + n for n in NAMES]
        assert not [n for n in tiny_model.hook_dict if n.startswith(LN2 + ".")]  # the read hook has none
        _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: "hook_sae" in n)
        assert list(cache.keys()) == spliced
    with tiny_model.transcoders(tc):
        assert OUT + ".hook_sae_error" not in tiny_model.hook_dict
    with tiny_model.saes(nn.ModuleList([tc])):  # a list of modules, as any sequence
        assert tiny_model.acts_to_saes == {OUT: tc}


# ----------------------------------------------------------------------------
# bad input, refused when spliced
# ----------------------------------------------------------------------------
def test_bad_splices_are_refused_by_name(tiny_model: GPT) -> None:
    names = list(tiny_model.hook_dict)
    with pytest.raises(TypeError, match=r"sae: expected an interp_gpt\.sae\.SAE, got Linear .*splice_hooks"):
        tiny_model.add_sae(nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(KeyError, match=r"sae reads 'blocks.0.ln2.hook_normalised'.*did you mean 'blocks.0.ln2.hook_normalized'"):  # fmt: skip
        tiny_model.add_sae(TinyTranscoder("blocks.0.ln2.hook_normalised"))
    with pytest.raises(ValueError, match=r"sae reads 'blocks.1.ln2.hook_normalized' after it writes 'blocks.0.hook_mlp_out'"):  # fmt: skip
        tiny_model.add_sae(TinyTranscoder("blocks.1.ln2.hook_normalized"))
    with pytest.raises(ValueError, match="float64 on cpu but the model is torch.float32"):
        tiny_model.add_sae(TinyTranscoder().double())
    assert list(tiny_model.hook_dict) == names
    tc = TinyTranscoder()
    with tiny_model.transcoders(tc):
        with pytest.raises(ValueError, match=r"sae reads 'blocks.0.hook_mlp_out.hook_sae_acts_post', a hook point of the module spliced in at 'blocks.0.hook_mlp_out'"):  # fmt: skip
            tiny_model.add_sae(TinyTranscoder(FEATS, "blocks.1.hook_mlp_out"))
    with tiny_model.transcoders(TinyTranscoder("blocks.0.hook_mlp_out", "blocks.0.hook_resid_mid")):
        with pytest.raises(ValueError, match=r"reads 'blocks.0.hook_mlp_out', which did not run before it"):
            tiny_model(torch.zeros(1, 3, dtype=torch.long))
