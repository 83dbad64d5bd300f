"""A CrossLayerTranscoder spliced through the one mechanism (`model.transcoders(clt)`): one view per layer,
each layer's features computed once per pass and decoded into every later layer.

Every expected value comes from plain hooks on the unspliced model (read each layer's input, encode it
with the definitions written out here, overwrite hook_mlp_out with the decoders of layers <= l).
"""

from __future__ import annotations

import copy
import gc
import threading
import weakref
from typing import Any

import pytest
import torch
from torch import Tensor

from interp_gpt import GPT
from interp_gpt.sae import CLTConfig, CrossLayerTranscoder
from interp_gpt.sae.training import shipped_clt
from interp_gpt.sae.transcoders.processing import model_processing

LN2 = "blocks.{}.ln2.hook_normalized"
OUT = "blocks.{}.hook_mlp_out"
FEATS = "blocks.0.hook_mlp_out.hook_sae_acts_post"


@pytest.fixture(scope="module")
def model() -> GPT:
    m = GPT.from_pretrained("tiny-gpt2")
    m.eval()
    return m


@pytest.fixture(scope="module")
def tokens(model: GPT) -> Tensor:
    return torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(0))


def make_clt(
    model: GPT, arch: str = "relu", skip: bool = False, read: str = "ln2.hook_normalized", **kw: Any
) -> CrossLayerTranscoder:
    meta = {"hook_name": read, "hook_name_out": "hook_mlp_out", "model_processing": model_processing(model)}
    cfg = dict(n_layers=2, d_in=128, d_sae=48, d_out=128, architecture=arch, skip=skip, metadata=meta)
    cfg.update(kw)
    if arch == "topk":
        cfg["k"] = 6
    clt = CrossLayerTranscoder(CLTConfig(**cfg))  # type: ignore[arg-type]
    clt.init_weights(seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        clt.b_enc.normal_(0.05, 0.1, generator=g)
        clt.b_dec.normal_(0, 0.1, generator=g)
        if skip:
            clt.W_skip.normal_(0, 0.02, generator=g)
        if arch == "jumprelu":
            clt.threshold.uniform_(0.0, 0.2, generator=g)
    return clt


def encode(clt: CrossLayerTranscoder, x: Tensor, layer: int) -> Tensor:
    """Layer l's features, the definitions written out (not the CLT's code)."""
    c = clt.cfg
    pre = x @ clt.W_enc[layer] + clt.b_enc[layer]
    if c.architecture == "relu":
        return pre.relu()
    if c.architecture == "jumprelu":
        kept = pre.relu() if c.nonnegative_acts else pre
        return torch.where(pre > clt.threshold[layer], kept, torch.zeros_like(pre))
    values, idx = pre.topk(c.k, dim=-1)  # type: ignore[arg-type]
    return torch.zeros_like(pre).scatter(-1, idx, values.relu() if c.nonnegative_acts else values)


def reference_hooks(clt: CrossLayerTranscoder, affine: list[tuple[Tensor, Tensor]] | None = None) -> list[Any]:
    """Plain hooks: read each layer's input (ln2's x_hat, times w plus b with `affine`: the MLP's input on
    raw weights), overwrite its hook_mlp_out with the decoders of layers <= l."""
    xs: dict[int, Tensor] = {}
    fs: dict[int, Tensor] = {}

    def read(layer: int) -> Any:
        def hook(x: Tensor, hook: Any) -> None:
            x = x if affine is None else x * affine[layer][0] + affine[layer][1]
            xs[layer], fs[layer] = x, encode(clt, x, layer)

        return hook

    def write(layer: int) -> Any:
        def hook(y: Tensor, hook: Any) -> Tensor:
            out = clt.b_dec[layer] + sum(fs[s] @ clt.W_dec[s][:, layer - s] for s in range(layer + 1))
            return out + xs[layer] @ clt.W_skip[layer].T if clt.cfg.skip else out

        return hook

    n = clt.n_layers
    return [(LN2.format(i), read(i)) for i in range(n)] + [(OUT.format(i), write(i)) for i in range(n)]


def replaced(model: GPT, clt: CrossLayerTranscoder, tokens: Tensor) -> Tensor:
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=reference_hooks(clt))


# ----------------------------------------------------------------------------
# the numbers
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["relu", "topk+skip", "jumprelu", "shipped"])
def test_without_the_error_term_the_clt_replaces_every_mlp_as_plain_hooks_would(
    model: GPT, tokens: Tensor, kind: str
) -> None:
    if kind == "shipped":
        clt = shipped_clt()
    else:
        clt = make_clt(model, kind.split("+")[0], skip=kind.endswith("skip"))
    want = replaced(model, clt, tokens)
    with torch.no_grad(), model.transcoders(clt):
        got, cache = model.run_with_cache(tokens)
        got_forward = model.forward(tokens)  # past model(...): the bottom frame
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_forward, want, atol=1e-5, rtol=1e-5)
    assert (got - model(tokens)).abs().max() > 1e-2  # the CLT did replace the MLPs
    with torch.no_grad():
        for s in range(2):  # each layer's features sit under its write hook
            feats = encode(clt, cache[LN2.format(s)], s)
            torch.testing.assert_close(cache[OUT.format(s) + ".hook_sae_acts_post"], feats, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # a CLT's cross-layer decoders matter: without them layer 1's output differs
        own = copy.deepcopy(clt)
        own.W_dec[0][:, 1] = 0
        assert (replaced(model, own, tokens) - want).abs().max() > 1e-3


@pytest.mark.parametrize("read", ["ln2.hook_normalized", "hook_resid_mid"])
def test_with_the_error_term_the_model_computes_what_it_computes_unspliced(
    model: GPT, tokens: Tensor, read: str
) -> None:
    clt = make_clt(model, "jumprelu", skip=True, read=read)
    with torch.no_grad():
        plain = model(tokens)
        watched = model.run_with_hooks(
            tokens, fwd_hooks=[(f"blocks.{i}.{read}", lambda x, hook: None) for i in range(2)]
        )
        with model.transcoders(clt, use_error_term=True):
            got = model(tokens)
            _, cache = model.run_with_cache(tokens)
        _, every = model.run_with_cache(tokens)  # every hook watched, as in `cache`
    for name in every.keys():  # every activation of the model, bit for bit
        assert torch.equal(cache[name], every[name]), name
    assert torch.equal(got, watched)  # bit for bit, as the model computes with the read hooks watched
    if read == "hook_resid_mid":
        assert torch.equal(got, plain)
    torch.testing.assert_close(got, plain, atol=1e-5, rtol=1e-5)
    want = replaced(model, clt, tokens) if read == "ln2.hook_normalized" else None
    assert want is None or (want - plain).abs().max() > 1e-2  # the prediction is poor: the error term works


@pytest.mark.parametrize("use_error_term", [False, True])
def test_zeroing_a_layer0_feature_moves_layer1_by_its_layer1_decoder_row(
    model: GPT, tokens: Tensor, use_error_term: bool
) -> None:
    """Layer 1's input is held at the clean run's, so only layer 0's decoder into layer 1 can move it."""
    clt = shipped_clt()
    with torch.no_grad(), model.transcoders(clt, use_error_term=use_error_term):
        _, cache = model.run_with_cache(tokens)
        f = int((cache[FEATS] != 0).sum((0, 1)).argmax())
        assert (cache[FEATS][..., f] != 0).any()
        seen: list[Tensor] = []

        def ablate(acts: Tensor, hook: Any) -> Tensor:
            acts = acts.clone()
            acts[..., f] = 0.0
            return acts

        model.run_with_hooks(
            tokens,
            fwd_hooks=[
                (FEATS, ablate),
                (LN2.format(1), lambda x, hook: cache[LN2.format(1)]),
                (OUT.format(1) + ".hook_sae_output", lambda x, hook: seen.append(x.clone())),
            ],
        )
    before = cache[OUT.format(1) + ".hook_sae_output"]  # with the error term: the MLP's own output
    if use_error_term:
        assert torch.equal(before, cache[OUT.format(1)])
    want = before - cache[FEATS][..., f, None] * clt.W_dec[0][f, 1].detach()
    torch.testing.assert_close(seen[0], want, atol=1e-5, rtol=1e-5)
    assert (seen[0] - before).abs().max() > 1e-4


def test_a_clt_for_raw_weights_is_spliced_converted_into_the_processed_model(model: GPT, tokens: Tensor) -> None:
    """circuit-tracer's kind: raw weights, reading the MLP's input (mlp.hook_in); on the processed model
    it computes what it computes on the raw one (log-probs: center_unembed shifts the logits)."""
    raw_model = GPT.from_pretrained_no_processing("tiny-gpt2")
    raw_model.eval()
    clt = make_clt(raw_model, "jumprelu", skip=True, read="mlp.hook_in")
    assert clt.cfg.processing == {"fold_ln": False, "center_writing_weights": False}
    affine = [(b.ln2.w.detach(), b.ln2.b.detach()) for b in raw_model.blocks]
    with torch.no_grad():
        want = raw_model.run_with_hooks(tokens, fwd_hooks=reference_hooks(clt, affine)).log_softmax(-1)
        with raw_model.transcoders(clt):
            on_raw = raw_model(tokens).log_softmax(-1)
        with model.transcoders(clt):
            on_processed = model(tokens).log_softmax(-1)
        converted = clt.converted_to(model)
        with model.transcoders(converted):
            via_converted = model(tokens).log_softmax(-1)
    torch.testing.assert_close(on_raw, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(on_processed, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(via_converted, on_processed, atol=1e-4, rtol=1e-4)
    assert (on_processed - model(tokens).log_softmax(-1)).abs().max() > 1e-2


# ----------------------------------------------------------------------------
# per thread, per pass, dropped on error
# ----------------------------------------------------------------------------
def test_each_thread_decodes_its_own_features(model: GPT, tokens: Tensor) -> None:
    """Two threads each stop between layer 0's write and layer 1's; the first to have started goes on first."""
    clt = make_clt(model, "relu")
    rows = {"a": tokens[:1], "b": tokens[1:]}
    want = {k: replaced(model, clt, t) for k, t in rows.items()}
    paused = {k: threading.Event() for k in rows}
    go = {k: threading.Event() for k in rows}
    got: dict[str, Tensor] = {}

    def wait(x: Tensor, hook: Any) -> None:
        name = threading.current_thread().name
        if name in rows:
            paused[name].set()
            assert go[name].wait(10)

    def run(name: str) -> None:
        with torch.no_grad():
            got[name] = model(rows[name])

    model.add_hook("blocks.1.hook_resid_pre", wait)
    threads = {k: threading.Thread(target=run, args=(k,), name=k) for k in rows}
    try:
        with model.transcoders(clt):
            threads["a"].start()
            assert paused["a"].wait(10)
            threads["b"].start()
            assert paused["b"].wait(10)
            go["a"].set()  # a decodes layer 1 while b's layer-0 features are the latest
            threads["a"].join(10)
            go["b"].set()
            threads["b"].join(10)
    finally:
        for e in go.values():
            e.set()
        model.reset_hooks()
    torch.testing.assert_close(got["a"], want["a"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["b"], want["b"], atol=1e-5, rtol=1e-5)


def test_a_pass_run_by_a_hook_has_its_own_features(model: GPT, tokens: Tensor) -> None:
    clt = make_clt(model, "relu")
    a, b = tokens[:1], tokens[1:]
    want_a, want_b = replaced(model, clt, a), replaced(model, clt, b)
    inner: list[Tensor] = []
    depth = [0]

    def nested(x: Tensor, hook: Any) -> None:
        if depth[0] == 0:  # between layer 0's features and layer 1's decoders, the model runs once more
            depth[0] += 1
            inner.append(model(b))

    with torch.no_grad(), model.transcoders(clt), model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", nested)]):
        outer = model(a)
    torch.testing.assert_close(outer, want_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(inner[0], want_b, atol=1e-5, rtol=1e-5)


def test_a_failed_pass_keeps_nothing(model: GPT, tokens: Tensor) -> None:
    clt = make_clt(model, "relu")
    refs: list[weakref.ref[Tensor]] = []

    def boom(x: Tensor, hook: Any) -> None:
        raise RuntimeError("boom")

    with model.transcoders(clt):
        keep = (FEATS, lambda x, hook: refs.append(weakref.ref(x)))
        with model.hooks(fwd_hooks=[keep, ("blocks.1.hook_resid_pre", boom)]):
            with pytest.raises(RuntimeError, match="boom"):
                model(tokens)
        gc.collect()
        assert refs and refs[0]() is None  # layer 0's features went with the pass
        assert model._reads()._frames() == [{}]
        with torch.no_grad():
            torch.testing.assert_close(model(tokens), replaced(model, clt, tokens), atol=1e-5, rtol=1e-5)


def test_passes_run_past_model_call_share_the_bottom_frame_but_not_their_features(model: GPT, tokens: Tensor) -> None:
    """`model.forward(...)` pushes no frame: a pass's layer 0 starts afresh, so the clean features a hook
    made one pass compute are not the next pass's."""
    clt = make_clt(model, "relu")
    a, b = tokens[:2], tokens[1:]
    zero_all = (FEATS, lambda x, hook: torch.zeros_like(x))
    watch_1 = ("blocks.1.hook_mlp_out.hook_sae_acts_post", lambda x, hook: None)
    with torch.no_grad(), model.transcoders(clt, use_error_term=True):
        with model.hooks(fwd_hooks=[zero_all]):
            model.forward(a)  # layer 0's clean features computed, then the pass ends past model(...)
        with model.hooks(fwd_hooks=[watch_1]):
            got = model.forward(b)  # layer 1's clean pass: from this pass's layer 0
    with torch.no_grad():
        want = model.run_with_hooks(b, fwd_hooks=[(LN2.format(i), lambda x, hook: None) for i in range(2)])
    assert torch.equal(got, want)


# ----------------------------------------------------------------------------
# splicing in and out; refusals
# ----------------------------------------------------------------------------
def test_the_model_lists_each_layer_and_is_restored_on_exit_and_on_error(model: GPT, tokens: Tensor) -> None:
    clt = make_clt(model, "relu")
    names = set(model.hook_dict)
    with torch.no_grad():
        before = model(tokens)
    with model.transcoders(clt):
        assert list(model.acts_to_saes) == [OUT.format(0), OUT.format(1)]
        assert [v.layer for v in model.acts_to_saes.values()] == [0, 1]
    assert model.acts_to_saes == {} and set(model.hook_dict) == names
    assert clt.layers[1].hook_sae_acts_post.name == "layers.1.hook_sae_acts_post"  # its own names back
    with pytest.raises(RuntimeError, match="inside"), model.transcoders(clt):
        raise RuntimeError("inside")
    assert model.acts_to_saes == {} and set(model.hook_dict) == names
    model.add_sae(clt)  # add_sae / reset_saes take it too
    assert list(model.acts_to_saes) == [OUT.format(0), OUT.format(1)]
    model.reset_saes()
    assert model.acts_to_saes == {} and model._reads()._frames() == [{}]
    with torch.no_grad():
        assert torch.equal(model(tokens), before)
    other = GPT.from_pretrained("tiny-gpt2")
    with model.transcoders(clt):  # spliced in one model, a copy of it splices into another
        with pytest.raises(ValueError, match="already spliced in"), other.transcoders(clt):
            pass
        with other.transcoders(copy.deepcopy(clt)):
            assert len(other.acts_to_saes) == 2


def test_bad_clts_are_refused_by_name(model: GPT, tokens: Tensor) -> None:
    with pytest.raises(ValueError, match=r"layer 2 does not exist: the model's layers are 0\.\.1"):
        with model.transcoders(make_clt(model, n_layers=3)):
            pass
    assert model.acts_to_saes == {}
    with pytest.raises(ValueError, match=r"d_in=64 does not fit 'blocks\.0\.ln2\.hook_normalized'"):
        with model.transcoders(make_clt(model, d_in=64)):
            pass
    other = make_clt(model)
    other.cfg.metadata["model_name"] = "gpt2-medium"
    with pytest.raises(ValueError, match=r"is for 'gpt2-medium'.*but the model is 'tiny-gpt2'"):
        with model.transcoders(other):
            pass
    with pytest.raises(KeyError, match="hook_normalised"):
        with model.transcoders(make_clt(model, read="ln2.hook_normalised")):
            pass
    raw_model = GPT.from_pretrained_no_processing("tiny-gpt2")
    with pytest.raises(ValueError, match=r"made for centred writing weights"):  # no exact conversion
        with raw_model.transcoders(make_clt(model)):
            pass
    assert raw_model.acts_to_saes == {}
    clt = make_clt(model)
    with pytest.raises(ValueError, match=r"layer 1 .* decodes layer 0's features"):
        with model.transcoders(clt.splice_parts()[1:]):  # layer 1 without layer 0
            model(tokens)
    with pytest.raises(ValueError, match="splice the CLT"):
        clt.splice_parts()[0].splice_forward(torch.zeros(1, 128))
    assert model.acts_to_saes == {} and model._reads()._frames() == [{}]
