"""Transcoders equal to circuit-tracer 0.5.0's own: SingleLayerTranscoder (ReLU, JumpReLU, TopK, with and
without skip), TranscoderSet, CrossLayerTranscoder (ReLU, JumpReLU); files both ways; its replacement
model on a random GPT-2 against our splice.

circuit-tracer pins transformers<=4.57 and huggingface_hub<1 and sits on transformer-lens 3's
HookedTransformer: CI runs this module in a venv of its own (.venv-ct, see .ci/run), e.g.
`PYTHONPATH=$PWD .venv-ct/bin/python -m pytest tests/test_transcoder_circuit_tracer.py`.

Their parameters are drawn at random and ours are built from their tensors by the test (the layouts
differ: their W_enc is [d_sae, d_model], their CLT skip is `x @ W_skip[l]`, ours `x @ W_skip[l].T`).
Where both run the same arithmetic (an activation on the same pre-activations, a decode of the same
activations) the numbers are compared bit for bit; where the matmuls differ (their F.linear / einsum,
our `x @ W_enc`) to 1e-6 relative to the tensor's scale (1e-12 in float64).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from interp_gpt.sae import (
    CLTConfig,
    CrossLayerTranscoder,
    Transcoder,
    TranscoderConfig,
    load_clt,
    load_transcoders,
    save_clt,
    save_transcoders,
)
from interp_gpt.sae.transcoders.transcoder import activate

pytest.importorskip("circuit_tracer", reason="circuit-tracer 0.5 needs its own venv (.venv-ct, see .ci/run)")
from circuit_tracer.transcoder.activation_functions import JumpReLU, TopK  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder as CTCrossLayerTranscoder  # noqa: E402
from circuit_tracer.transcoder.cross_layer_transcoder import load_clt as ct_load_clt  # noqa: E402
from circuit_tracer.transcoder.single_layer_transcoder import (  # noqa: E402
    SingleLayerTranscoder,
    TranscoderSet,
    load_transcoder_set,
)
from circuit_tracer.utils.caching import load_transcoders_from_cache  # noqa: E402

CPU = torch.device("cpu")
# (d_model, d_sae, k, seed, dtype): circuit-tracer's transcoders read and write one width, d_model
SHAPES = [
    (8, 24, 3, 0, torch.float32),
    (16, 48, 5, 1, torch.float64),
    (5, 7, 1, 2, torch.float32),
    (12, 100, 12, 3, torch.float64),
]
KINDS = ["relu", "jumprelu", "topk"]
IN_HOOK, OUT_HOOK = "ln2.hook_normalized", "hook_mlp_out"


def tol(dtype: torch.dtype) -> float:
    return 1e-6 if dtype == torch.float32 else 1e-12


def assert_near(mine: torch.Tensor, ref: torch.Tensor, rel: float | None = None) -> None:
    """Equal to `rel` (default `tol`) relative to the reference's scale (elementwise relative error is
    meaningless for sums that cancel to ~0)."""
    assert mine.shape == ref.shape and mine.dtype == ref.dtype
    scale = float(ref.abs().max()) or 1.0
    torch.testing.assert_close(mine, ref, rtol=0, atol=(rel or tol(ref.dtype)) * scale)


def assert_same(mine: torch.Tensor, ref: torch.Tensor) -> None:
    assert mine.shape == ref.shape and mine.dtype == ref.dtype
    torch.testing.assert_close(mine, ref, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# Random transcoders: theirs drawn at random, ours built from their tensors
# ----------------------------------------------------------------------------------------------
def their_plt(
    kind: str, skip: bool, d: int, f: int, k: int, seed: int, dtype: torch.dtype, layer: int = 0
) -> SingleLayerTranscoder:
    g = torch.Generator().manual_seed(seed * 100 + layer)
    if kind == "relu":
        act = torch.nn.functional.relu
    elif kind == "jumprelu":  # thresholds straddle 0: their JumpReLU keeps negative values above them
        act = JumpReLU(torch.randn(f, generator=g, dtype=dtype) * 0.5, 0.1)
    else:
        act = TopK(k)
    tc = SingleLayerTranscoder(d, f, act, layer, skip_connection=skip, device=CPU, dtype=dtype)
    with torch.no_grad():
        for name in ("W_enc", "W_dec", "b_enc", "b_dec", "W_skip"):
            p = getattr(tc, name)
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * (0.3 if name == "W_skip" else 1.0))
        if kind == "topk":  # mostly negative pre-activations: the k largest include negative ones
            tc.b_enc.sub_(2 * d**0.5)
    return tc


def ours_from(tc: SingleLayerTranscoder, kind: str, k: int, layer: int = 0) -> Transcoder:
    cfg = TranscoderConfig(
        d_in=tc.d_model,
        d_sae=tc.d_transcoder,
        d_out=tc.d_model,
        architecture=kind,
        skip=tc.W_skip is not None,
        k=k if kind == "topk" else None,
        nonnegative_acts=kind == "relu",  # circuit-tracer's JumpReLU and TopK keep negative values
        dtype=str(tc.dtype).removeprefix("torch."),
        metadata={"hook_name": f"blocks.{layer}.{IN_HOOK}", "hook_name_out": f"blocks.{layer}.{OUT_HOOK}"},
    )
    state = {"W_enc": tc.W_enc.T, "W_dec": tc.W_dec, "b_enc": tc.b_enc, "b_dec": tc.b_dec}
    if tc.W_skip is not None:
        state["W_skip"] = tc.W_skip
    if kind == "jumprelu":
        state["threshold"] = tc.activation_function.threshold
    mine = Transcoder(cfg)
    mine.load_state_dict({key: v.detach().clone() for key, v in state.items()}, strict=True)
    return mine


def inputs(d: int, dtype: torch.dtype, seed: int, shape: tuple[int, ...] = (3, 6)) -> torch.Tensor:
    return torch.randn(*shape, d, generator=torch.Generator().manual_seed(1000 + seed), dtype=dtype)


def assert_plt_numbers(mine: Transcoder, theirs: SingleLayerTranscoder, x: torch.Tensor, kind: str) -> None:
    """encode, the activation alone, decode, skip and forward: ours against theirs."""
    with torch.no_grad():
        pre_ref = theirs.encode(x, apply_activation_function=False)
        acts_ref = theirs.encode(x)
        assert_near(x @ mine.W_enc + mine.b_enc, pre_ref)
        # the same pre-activations through both activations: the same arithmetic, bit for bit
        threshold = mine.threshold if kind == "jumprelu" else None
        assert_same(activate(pre_ref, mine.cfg, threshold), theirs.activation_function(pre_ref))
        acts = mine.encode(x)
        assert_near(acts, acts_ref)
        on = acts_ref != 0
        assert 0 < on.float().mean() < 1  # some features on, some off
        if kind != "relu":
            assert bool((acts_ref < 0).any()), "negative activations kept (thresholds straddle 0 / TopK)"
        # decode of the same activations: the same arithmetic, skip included
        assert_same(mine.decode(acts_ref, x), theirs.decode(acts_ref, x))
        if mine.cfg.skip:
            assert_same(x @ mine.W_skip.T, theirs.compute_skip(x))
        assert_near(mine(x), theirs(x))


# ----------------------------------------------------------------------------------------------
# Per-layer transcoders: the numbers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"d{s[0]}-f{s[1]}-k{s[2]}-s{s[3]}-{str(s[4])[6:]}")
@pytest.mark.parametrize("skip", [False, True], ids=["noskip", "skip"])
@pytest.mark.parametrize("kind", KINDS)
def test_single_layer_transcoder_numbers_equal_circuit_tracers(kind: str, skip: bool, shape: tuple) -> None:
    d, f, k, seed, dtype = shape
    theirs = their_plt(kind, skip, d, f, k, seed, dtype)
    mine = ours_from(theirs, kind, k)
    assert_plt_numbers(mine, theirs, inputs(d, dtype, seed), kind)
    # their sparse path (what attribution uses), position 0 zeroed as it does: ours on the same activations
    x = inputs(d, dtype, seed, shape=(7,))
    with torch.no_grad():
        sparse, active_enc = theirs.encode_sparse(x.clone())
        recon, _ = theirs.decode_sparse(sparse, x)
        acts = mine.encode(x)
        acts[0] = 0
        assert_near(sparse.to_dense(), acts)
        assert_near(mine.decode(acts, x), recon)
        _, feat = sparse.indices()
        assert_same(mine.W_enc.T[feat], active_enc)


# ----------------------------------------------------------------------------------------------
# Per-layer sets: files both ways
# ----------------------------------------------------------------------------------------------
def their_set(kind: str, skip: bool, shape: tuple, n_layers: int = 3) -> TranscoderSet:
    d, f, k, seed, dtype = shape
    return TranscoderSet(
        {i: their_plt(kind, skip, d, f, k, seed, dtype, layer=i) for i in range(n_layers)},
        feature_input_hook=IN_HOOK,
        feature_output_hook=OUT_HOOK,
        scan="test-scan",
    )


def write_their_set(tset: TranscoderSet, folder: Path) -> None:
    """What circuit-tracer's cache holds (utils/caching.py's save_transcoders_to_cache): each layer by
    its own `to_safetensors`, then a config.yaml (the hub's config less `transcoders`, plus scan and
    revision), written by yaml.dump as it does."""
    tset.to_safetensors(str(folder))
    config = {
        "model_name": "gpt2",
        "model_kind": "transcoder_set",
        "feature_input_hook": tset.feature_input_hook,
        "feature_output_hook": tset.feature_output_hook,
        "scan": tset.scan,
        "revision": None,
    }
    (folder / "config.yaml").write_text(yaml.dump(config), encoding="utf-8")


SET_CASES = [(kind, skip, shape) for kind in ("relu", "jumprelu") for skip in (False, True) for shape in SHAPES[:2]]


@pytest.mark.parametrize(("kind", "skip", "shape"), SET_CASES)
def test_circuit_tracer_files_load_here_with_its_numbers(tmp_path: Path, kind: str, skip: bool, shape: tuple) -> None:
    d, f, k, seed, dtype = shape
    tset = their_set(kind, skip, shape)
    write_their_set(tset, tmp_path / "set")
    mine = load_transcoders(tmp_path / "set")
    assert [tc.layer for tc in mine] == [0, 1, 2]
    assert [tc.input_hook for tc in mine] == [f"blocks.{i}.{IN_HOOK}" for i in range(3)]
    assert [tc.output_hook for tc in mine] == [f"blocks.{i}.{OUT_HOOK}" for i in range(3)]
    xs = inputs(d, dtype, seed, shape=(3, 4, 5))  # [n_layers, pos... , d]
    for i, tc in enumerate(mine):
        assert (tc.cfg.architecture, tc.cfg.skip, tc.dtype) == (kind, skip, dtype)
        assert_plt_numbers(tc, tset[i], xs[i], kind)
    with torch.no_grad():  # the set's own stacked encode / decode
        acts = torch.stack([tc.encode(xs[i]) for i, tc in enumerate(mine)])
        assert_near(acts, tset.encode(xs))
        assert_same(torch.stack([tc.decode(acts[i], xs[i]) for i, tc in enumerate(mine)]), tset.decode(acts, xs))


@pytest.mark.parametrize(("kind", "skip", "shape"), SET_CASES)
def test_our_circuit_tracer_files_load_there_with_our_numbers(
    tmp_path: Path, kind: str, skip: bool, shape: tuple
) -> None:
    d, f, k, seed, dtype = shape
    mine = [ours_from(t, kind, k, layer=i) for i, t in enumerate(their_set(kind, skip, shape))]
    save_transcoders(mine, tmp_path / "set", format="circuit-tracer")
    # its cache loader (config.yaml + layer_<i>.safetensors), decoders read lazily from our files
    tset, config = load_transcoders_from_cache("set", cache_dir=tmp_path, device=CPU, dtype=dtype)
    assert (tset.feature_input_hook, tset.feature_output_hook) == (IN_HOOK, OUT_HOOK)
    assert config["model_kind"] == "transcoder_set" and tset.skip_connection == skip
    # and its plain loader, file by file
    paths = {i: str(tmp_path / "set" / f"layer_{i}.safetensors") for i in range(3)}
    eager = load_transcoder_set(paths, "s", IN_HOOK, OUT_HOOK, device=CPU, dtype=dtype, lazy_encoder=False)
    xs = inputs(d, dtype, seed + 7, shape=(3, 4, 5))
    for i, tc in enumerate(mine):
        assert_plt_numbers(tc, tset[i], xs[i], kind)
        assert_plt_numbers(tc, eager[i], xs[i], kind)


def test_our_topk_set_is_refused_by_circuit_tracer_not_misread(tmp_path: Path) -> None:
    """circuit-tracer 0.5.0 has TopK in memory but no TopK on disk: its loader ignores the config's
    `activation: topk` and builds a ReLU from the weights. Our TopK layer files therefore carry `k`
    (a 0-d tensor, as circuit-tracer's later TopK writes it), which its strict load refuses."""
    d, f, k, seed, dtype = SHAPES[0]
    mine = [ours_from(t, "topk", k, layer=i) for i, t in enumerate(their_set("topk", True, SHAPES[0]))]
    save_transcoders(mine, tmp_path / "set", format="circuit-tracer")
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*\"k\""):
        load_transcoders_from_cache("set", cache_dir=tmp_path, device=CPU, dtype=dtype)
    # ours reads them back bit for bit, k included
    back = load_transcoders(tmp_path / "set")
    x = inputs(d, dtype, seed)
    for a, b in zip(mine, back, strict=True):
        assert (b.cfg.architecture, b.cfg.k, b.cfg.nonnegative_acts) == ("topk", k, False)
        assert_same(b(x), a(x))


def test_two_widths_load_there_lazily_and_are_refused_eagerly(tmp_path: Path) -> None:
    """circuit-tracer's SingleLayerTranscoder has one width, d_model (read from b_dec): a transcoder with
    d_in != d_out loads through its default lazy encoder and computes our numbers; its eager load stops
    with a shape error. Never other numbers."""
    tc = Transcoder(
        TranscoderConfig(
            d_in=6,
            d_sae=10,
            d_out=4,
            metadata={"hook_name": f"blocks.0.{IN_HOOK}", "hook_name_out": f"blocks.0.{OUT_HOOK}"},
        )
    )
    with torch.no_grad():
        for p in tc.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    save_transcoders(tc, tmp_path / "set", format="circuit-tracer")
    paths = {0: str(tmp_path / "set" / "layer_0.safetensors")}
    lazy = load_transcoder_set(paths, "s", IN_HOOK, OUT_HOOK, device=CPU)  # lazy encoder and decoder: its default
    assert_plt_numbers(tc, lazy[0], inputs(6, torch.float32, 0), "relu")
    with pytest.raises(RuntimeError, match="size mismatch for W_enc"):
        load_transcoders_from_cache("set", cache_dir=tmp_path, device=CPU)  # eager encoder: its cache's default


# ----------------------------------------------------------------------------------------------
# Cross-layer transcoders
# ----------------------------------------------------------------------------------------------
CLT_SHAPES = [
    (3, 8, 20, 0, torch.float32),
    (2, 16, 40, 1, torch.float64),
    (4, 5, 9, 2, torch.float32),
]


def their_clt(kind: str, skip: bool, shape: tuple) -> CTCrossLayerTranscoder:
    n, d, f, seed, dtype = shape
    clt = CTCrossLayerTranscoder(
        n,
        f,
        d,
        activation_function="jump_relu" if kind == "jumprelu" else "relu",
        skip_connection=skip,
        lazy_decoder=False,
        lazy_encoder=False,
        feature_input_hook=IN_HOOK,
        feature_output_hook=OUT_HOOK,
        device=CPU,
        dtype=dtype,
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in clt.named_parameters():
            scale = 0.5 if "threshold" in name else 0.3 if "W_skip" in name else 1.0
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * scale)
    return clt


def clt_from(theirs: CTCrossLayerTranscoder, kind: str) -> CrossLayerTranscoder:
    cfg = CLTConfig(
        n_layers=theirs.n_layers,
        d_in=theirs.d_model,
        d_sae=theirs.d_transcoder,
        d_out=theirs.d_model,
        architecture=kind,
        skip=theirs.W_skip is not None,
        nonnegative_acts=kind == "relu",
        dtype=str(theirs.dtype).removeprefix("torch."),
        metadata={"hook_name": IN_HOOK, "hook_name_out": OUT_HOOK},
    )
    state = {"W_enc": theirs.W_enc.transpose(1, 2), "b_enc": theirs.b_enc, "b_dec": theirs.b_dec}
    state.update({f"W_dec.{i}": w for i, w in enumerate(theirs.W_dec)})
    if theirs.W_skip is not None:  # theirs adds x @ W_skip[l], ours x @ W_skip[l].T
        state["W_skip"] = theirs.W_skip.transpose(1, 2)
    if kind == "jumprelu":  # theirs [n_layers, 1, d_sae]
        state["threshold"] = theirs.activation_function.threshold.squeeze(1)
    mine = CrossLayerTranscoder(cfg)
    mine.load_state_dict({key: v.detach().clone() for key, v in state.items()}, strict=True)
    return mine


def assert_clt_numbers(mine: CrossLayerTranscoder, theirs: CTCrossLayerTranscoder, xs: torch.Tensor, kind: str) -> None:
    """encode (all layers and one), the activation, decode (every layer's decoders), skip, forward."""
    n = mine.n_layers
    with torch.no_grad():
        acts_ref = theirs.encode(xs)
        acts = mine.encode(xs)
        assert_near(acts, acts_ref)
        assert 0 < (acts_ref != 0).float().mean() < 1
        if kind == "jumprelu":
            assert bool((acts_ref < 0).any()), "thresholds straddle 0: negative activations kept"
        for i in range(n):
            pre_ref = theirs.encode_layer(xs[i], i, apply_activation_function=False)
            assert_near(xs[i] @ mine.W_enc[i] + mine.b_enc[i], pre_ref)
            threshold = mine.threshold[i] if kind == "jumprelu" else None
            assert_same(activate(pre_ref, mine.cfg, threshold), theirs.apply_activation_function(i, pre_ref))
            assert_near(mine.encode_layer(xs[i], i), theirs.encode_layer(xs[i], i))
            if mine.cfg.skip:  # the same product, but of a transposed copy: equal to rounding
                assert_near(xs[i] @ mine.W_skip[i].T, theirs.compute_skip(i, xs[i]))
        # decode: theirs through sparse decoder rows (index_add), ours dense; the same activations
        ref = theirs.decode(acts_ref, xs if mine.cfg.skip else None)
        assert_near(mine.decode(acts_ref, xs if mine.cfg.skip else None), ref)
        for m in range(n):
            assert_near(mine.decode_layer(acts_ref[: m + 1], m, xs[m] if mine.cfg.skip else None), ref[m])
        if not mine.cfg.skip:  # its forward cannot run with a skip (decode gets no input there)
            assert_near(mine(xs), theirs(xs))
        recon = theirs.compute_attribution_components(xs)["reconstruction"]
        zeroed = acts.clone()
        zeroed[:, 0] = 0  # circuit-tracer zeroes position 0's features for attribution
        assert_near(mine.decode(zeroed, xs if mine.cfg.skip else None), recon)


@pytest.mark.parametrize("shape", CLT_SHAPES, ids=lambda s: f"n{s[0]}-d{s[1]}-f{s[2]}-s{s[3]}-{str(s[4])[6:]}")
@pytest.mark.parametrize("skip", [False, True], ids=["noskip", "skip"])
@pytest.mark.parametrize("kind", ["relu", "jumprelu"])
def test_cross_layer_transcoder_numbers_equal_circuit_tracers(kind: str, skip: bool, shape: tuple) -> None:
    theirs = their_clt(kind, skip, shape)
    n, d, _, seed, dtype = shape
    assert_clt_numbers(clt_from(theirs, kind), theirs, inputs(d, dtype, seed, shape=(n, 6)), kind)


def write_their_clt(clt: CTCrossLayerTranscoder, folder: Path) -> None:
    """Its own writer (`to_safetensors`: W_enc_<i> / W_dec_<i> files) plus the config.yaml its cache writes."""
    clt.to_safetensors(str(folder))
    config = {
        "model_kind": "cross_layer_transcoder",
        "feature_input_hook": clt.feature_input_hook,
        "feature_output_hook": clt.feature_output_hook,
        "scan": "test-scan",
        "revision": None,
    }
    (folder / "config.yaml").write_text(yaml.dump(config), encoding="utf-8")


@pytest.mark.parametrize("shape", CLT_SHAPES, ids=lambda s: f"n{s[0]}-d{s[1]}-s{s[3]}-{str(s[4])[6:]}")
@pytest.mark.parametrize("kind", ["relu", "jumprelu"])
def test_clt_files_both_ways(tmp_path: Path, kind: str, shape: tuple) -> None:
    """circuit-tracer's CLT files load here with its numbers; ours load there with ours (its files store
    no skip, so both directions are skip-free)."""
    theirs = their_clt(kind, False, shape)
    n, d, _, seed, dtype = shape
    xs = inputs(d, dtype, seed, shape=(n, 6))
    write_their_clt(theirs, tmp_path / "theirs")
    mine = load_clt(tmp_path / "theirs")
    assert (mine.cfg.architecture, mine.cfg.nonnegative_acts, mine.dtype) == (kind, kind == "relu", dtype)
    assert (mine.input_hook(1), mine.output_hook(1)) == (f"blocks.1.{IN_HOOK}", f"blocks.1.{OUT_HOOK}")
    assert_clt_numbers(mine, theirs, xs, kind)

    save_clt(mine, tmp_path / "ours")
    for lazy in (False, True):  # its loader, decoders in memory or read lazily from our files
        back = ct_load_clt(str(tmp_path / "ours"), device=CPU, dtype=dtype, lazy_decoder=lazy)
        assert_clt_numbers(mine, back, xs, kind)
    cached, config = load_transcoders_from_cache("ours", cache_dir=tmp_path, device=CPU, dtype=dtype)
    assert config["model_kind"] == "cross_layer_transcoder"
    assert (cached.feature_input_hook, cached.feature_output_hook) == (IN_HOOK, OUT_HOOK)
    assert_clt_numbers(mine, cached, xs, kind)


CANNOT = {"skip": dict(skip=True), "topk": dict(architecture="topk", k=3, nonnegative_acts=False)}


@pytest.mark.parametrize("what", list(CANNOT))
def test_our_clt_circuit_tracer_cannot_compute_is_refused_there(tmp_path: Path, what: str) -> None:
    """A CLT circuit-tracer's files cannot hold (a skip, TopK) is written under another model_kind: its
    loader refuses it by name rather than computing other numbers."""
    fields = dict(n_layers=2, d_in=6, d_sae=10, d_out=6, metadata={"hook_name": IN_HOOK, "hook_name_out": OUT_HOOK})
    clt = CrossLayerTranscoder(CLTConfig(**{**fields, **CANNOT[what]}))  # type: ignore[arg-type]
    save_clt(clt, tmp_path / "ours")
    with pytest.raises(ValueError, match="Unknown model kind"):
        load_transcoders_from_cache("ours", cache_dir=tmp_path, device=CPU)
    back = load_clt(tmp_path / "ours")
    xs = inputs(6, torch.float32, 0, shape=(2, 5))
    assert_same(back(xs), clt(xs))


# ----------------------------------------------------------------------------------------------
# The replacement model on a random GPT-2 (raw weights)
# ----------------------------------------------------------------------------------------------
def their_replacement_model(hf_model, tset: TranscoderSet):  # type: ignore[no-untyped-def]
    """circuit-tracer's TransformerLensReplacementModel on `hf_model`'s raw weights (no fold_ln, no
    centring, as its own from_pretrained loads them), built offline from a HookedTransformerConfig."""
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf_model.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn=c.activation_function,
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel",
        device="cpu",
        dtype=torch.float32,
    )
    state = convert_gpt2_weights(hf_model, cfg)
    model = TransformerLensReplacementModel.from_config(cfg, tset)
    # its replacement wraps each MLP and the unembedding: blocks.L.mlp.old_mlp.W_in, unembed.old_unembed.W_U
    own = model.state_dict()
    renamed = {}
    for key, v in state.items():
        for a, b in (("", ""), (".mlp.", ".mlp.old_mlp."), ("unembed.", "unembed.old_unembed.")):
            if key.replace(a, b, 1) in own:
                renamed[key.replace(a, b, 1)] = v
                break
        else:
            raise AssertionError(f"{key} has no place in circuit-tracer's model")
    renamed.setdefault("unembed.old_unembed.b_U", torch.zeros(c.vocab_size))  # GPT-2 has no unembedding bias
    missing = model.load_state_dict(renamed, strict=False).missing_keys
    assert all(m.startswith("transcoders.") or m.endswith((".mask", ".IGNORE")) for m in missing), missing
    return model.eval()


@pytest.mark.parametrize(
    ("in_hook", "kind", "skip"), [("ln2.hook_normalized", "jumprelu", True), ("hook_resid_mid", "topk", False)]
)
def test_replacement_model_equals_our_splice_with_the_error_term(
    hf_model, hf_checkpoint_dir: Path, in_hook: str, kind: str, skip: bool
) -> None:  # type: ignore[no-untyped-def]
    """circuit-tracer's replacement model runs the real MLPs: its transcoders are read, not spliced into
    the forward pass (attention patterns and LayerNorm scales are frozen for its gradients only). By its
    definitions (replacement_model_transformerlens.py, setup_attribution / get_activations) the logits are
    the model's, the features are the transcoders' readings of the real MLP inputs, and the error is
    `hook_mlp_out` minus the reconstruction (b_dec and skip included); position 0 (its BOS) has its
    features and errors zeroed. That is our `with model.transcoders(tcs, use_error_term=True)` on the same
    raw weights: the logits, `hook_sae_acts_post` and `hook_sae_error` are compared at positions >= 1,
    and position 0 is zero on its side by definition. (Without the error term there is nothing of its
    to compare: it never replaces an MLP's output in a forward pass.)"""
    from interp_gpt import GPT

    d, f, k = hf_model.config.n_embd, 96, 8
    n = hf_model.config.n_layer
    acts_fn = {"jumprelu": lambda: JumpReLU(torch.randn(f, generator=g) * 0.5, 0.1), "topk": lambda: TopK(k)}[kind]
    g = torch.Generator().manual_seed(5)
    plts = {}
    for layer in range(n):
        t = SingleLayerTranscoder(d, f, acts_fn(), layer, skip_connection=skip, device=CPU, dtype=torch.float32)
        with torch.no_grad():
            for name in ("W_enc", "W_dec", "b_enc", "b_dec", "W_skip"):
                p = getattr(t, name)
                if p is not None:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        plts[layer] = t
    tset = TranscoderSet(plts, feature_input_hook=in_hook, feature_output_hook=OUT_HOOK, scan="test-scan")
    mine = []
    for layer in range(n):
        tc = ours_from(plts[layer], kind, k, layer=layer)
        tc.cfg.metadata["hook_name"] = f"blocks.{layer}.{in_hook}"
        mine.append(tc)
    theirs = their_replacement_model(hf_model, tset)
    model = GPT.from_pretrained_no_processing(str(hf_checkpoint_dir))
    tokens = torch.tensor([[3, 17, 42, 9, 88, 5, 61, 0, 23]])

    with torch.no_grad():
        ref_logits = theirs(tokens)
        _, ref_acts = theirs.get_activations(tokens)  # [n_layers, pos, d_sae], position 0 zeroed
        ctx = theirs.setup_attribution(tokens[0])  # error_vectors [n_layers, pos, d_model], position 0 zeroed
        with model.transcoders(mine, use_error_term=True):
            logits, cache = model.run_with_cache(tokens)
    # two implementations of the whole forward pass (theirs transformer-lens 3's): float32 rounding apart
    assert_near(logits, ref_logits, rel=1e-5)
    # the error term gives back the model's own output: each spliced hook_mlp_out is x exactly, and what
    # follows is the same arithmetic, equal to float error (splicing.py: bit for bit on one thread; with
    # more, a pass watching other hooks may split a reduction otherwise: 6e-8 seen on 2 threads)
    assert_near(logits, model.run_with_cache(tokens)[0], rel=1e-6)
    for layer in range(n):
        name = f"blocks.{layer}.{OUT_HOOK}"
        acts, err = cache[f"{name}.hook_sae_acts_post"][0], cache[f"{name}.hook_sae_error"][0]
        assert_near(acts[1:], ref_acts[layer, 1:], rel=1e-5)
        assert 0 < (ref_acts[layer, 1:] != 0).float().mean() < 1
        assert bool((ref_acts[layer, 0] == 0).all()) and bool((ctx.error_vectors[layer, 0] == 0).all())
        assert_near(err[1:], ctx.error_vectors[layer, 1:], rel=1e-5)
