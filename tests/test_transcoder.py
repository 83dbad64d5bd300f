"""Per-layer transcoders: numbers against an einsum reference written here, hook points, and files.

The reference implements the two definitions the formats carry (sae-lens: ReLU'd JumpReLU;
circuit-tracer: JumpReLU and TopK keeping negative values) from the maths, not from the module.
Files: every architecture x skip round-trips bit for bit through both formats; circuit-tracer
files written by hand here (its layout: W_enc [d_sae, d_in]) load with its numbers.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from interp_gpt import files
from interp_gpt.sae import Transcoder, TranscoderConfig, load_transcoders, save_transcoders

D_IN, D_SAE, D_OUT = 12, 40, 10  # d_in != d_out: a transposed weight cannot pass unnoticed
ARCHS = ("relu", "jumprelu", "topk")


def meta(layer: int, hook_in: str = "ln2.hook_normalized") -> dict[str, str]:
    return {"hook_name": f"blocks.{layer}.{hook_in}", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}


def make(
    arch: str,
    skip: bool,
    layer: int = 0,
    nonneg: bool = True,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    model_name: str | None = None,
) -> Transcoder:
    """A transcoder with every tensor random (biases too; thresholds straddling 0)."""
    m: dict[str, str] = meta(layer)
    if model_name:
        m["model_name"] = model_name
    cfg = TranscoderConfig(
        d_in=D_IN,
        d_sae=D_SAE,
        d_out=D_OUT,
        architecture=arch,
        skip=skip,
        k=7 if arch == "topk" else None,
        nonnegative_acts=nonneg,
        dtype=str(dtype).removeprefix("torch."),
        metadata=m,
    )
    tc = Transcoder(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tc.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    return tc


def reference(tc: Transcoder, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(acts, output) from the definitions, in float64, with einsum and a sort-based top-k."""
    p = {k: v.detach().double() for k, v in tc.state_dict().items()}
    x = x.double()
    pre = torch.einsum("...i,is->...s", x, p["W_enc"]) + p["b_enc"]
    arch, nonneg = tc.cfg.architecture, tc.cfg.nonnegative_acts
    if arch == "relu":
        acts = torch.where(pre > 0, pre, torch.zeros_like(pre))
    elif arch == "jumprelu":
        acts = torch.where(pre > p["threshold"], pre, torch.zeros_like(pre))
    else:
        kth = pre.sort(dim=-1, descending=True).values[..., tc.cfg.k - 1 : tc.cfg.k]
        acts = torch.where(pre >= kth, pre, torch.zeros_like(pre))
    if nonneg:
        acts = acts.clamp(min=0)
    out = torch.einsum("...s,so->...o", acts, p["W_dec"]) + p["b_dec"]
    if tc.cfg.skip:
        out = out + torch.einsum("...i,oi->...o", x, p["W_skip"])
    return acts, out


VARIANTS = [
    (a, s, n) for a, s, n in itertools.product(ARCHS, (False, True), (True, False)) if not (a == "relu" and not n)
]


@pytest.mark.parametrize("arch,skip,nonneg", VARIANTS)
def test_encode_decode_forward_equal_the_definitions(arch: str, skip: bool, nonneg: bool) -> None:
    tc = make(arch, skip, nonneg=nonneg, dtype=torch.float64)
    if arch == "topk":
        with torch.no_grad():
            tc.b_enc -= 2.0  # some of the k largest pre-activations are negative
    x = torch.randn(3, 5, D_IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref_acts, ref_out = reference(tc, x)
    acts = tc.encode(x)
    torch.testing.assert_close(acts, ref_acts, rtol=0, atol=1e-12)
    torch.testing.assert_close(tc.decode(acts, x), ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(tc(x), ref_out, rtol=0, atol=1e-12)
    if arch == "topk":
        assert ((acts != 0).sum(-1) <= 7).all()
    if arch != "relu" and not nonneg:  # the format's difference shows: some kept values are negative
        assert (acts < 0).any()


def test_float32_input_of_another_dtype_is_cast() -> None:
    tc = make("jumprelu", True)
    x = torch.randn(4, D_IN, dtype=torch.float64)
    _, ref_out = reference(tc, x.float())
    out = tc(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)


def test_hook_points_see_each_step_and_recons_includes_the_skip() -> None:
    tc = make("topk", True)
    x = torch.randn(2, 3, D_IN)
    seen: dict[str, torch.Tensor] = {}
    for name in tc.hook_names:
        getattr(tc, name).add_hook(lambda t, hook: seen.__setitem__(hook.name, t.clone()))
    out = tc(x)
    assert set(seen) == {
        "hook_sae_input",
        "hook_sae_acts_pre",
        "hook_sae_acts_post",
        "hook_sae_recons",
        "hook_sae_output",
    }
    ref_acts, ref_out = reference(tc, x)
    torch.testing.assert_close(seen["hook_sae_acts_post"].double(), ref_acts, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["hook_sae_recons"].double(), ref_out, rtol=1e-5, atol=1e-5)
    assert torch.equal(seen["hook_sae_output"], out)
    assert seen["hook_sae_acts_pre"].shape == (2, 3, D_SAE) and seen["hook_sae_input"].shape == (2, 3, D_IN)
    tc.reset_hooks()
    assert torch.equal(tc(x), out)


def test_a_hook_that_zeroes_the_features_leaves_bias_and_skip() -> None:
    tc = make("relu", True)
    x = torch.randn(2, D_IN)
    tc.hook_sae_acts_post.add_hook(lambda t, hook: torch.zeros_like(t))
    p = tc.state_dict()
    torch.testing.assert_close(tc(x), p["b_dec"] + x @ p["W_skip"].T)


def test_the_splice_interface() -> None:
    tc = make("jumprelu", True, layer=1)
    assert (tc.input_hook, tc.output_hook, tc.layer) == ("blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out", 1)
    assert (tc.d_in, tc.d_sae, tc.d_out) == (D_IN, D_SAE, D_OUT)
    assert tc.cfg.hook_name == tc.input_hook
    x = torch.randn(4, D_IN)
    acts, x_in = tc._encode(x, hooked=False)  # the error term's clean pass runs past the hooks
    tc.hook_sae_acts_post.add_hook(lambda t, hook: t * 0)
    torch.testing.assert_close(tc._decode(acts, x_in, hooked=False), reference(tc, x)[1].float(), rtol=1e-5, atol=1e-5)


def test_init_weights_is_reproducible_and_has_sae_lens_bounds() -> None:
    a, b = make("relu", True), make("relu", True)
    a.init_weights(seed=3)
    b.init_weights(seed=3)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert a.W_enc.abs().max() <= (6 / D_SAE) ** 0.5 and a.W_dec.abs().max() <= (6 / D_OUT) ** 0.5
    assert not a.W_skip.any() and not a.b_dec.any() and not a.b_enc.any()


# ------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------
def same(a: Transcoder, b: Transcoder) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    for f in ("d_in", "d_sae", "d_out", "architecture", "skip", "k", "nonnegative_acts", "dtype"):
        assert getattr(a.cfg, f) == getattr(b.cfg, f), f
    assert (a.input_hook, a.output_hook, a.cfg.model_name) == (b.input_hook, b.output_hook, b.cfg.model_name)


@pytest.mark.parametrize("fmt", ["saelens", "circuit-tracer"])
@pytest.mark.parametrize("arch,skip", list(itertools.product(ARCHS, (False, True))))
def test_every_kind_round_trips_bit_for_bit(tmp_path: Path, fmt: str, arch: str, skip: bool) -> None:
    # circuit-tracer keeps negative values; sae-lens' JumpReLU clamps them (its TopK file is ours: either)
    nonneg = arch == "relu" or (fmt == "saelens" and arch == "jumprelu")
    tcs = [make(arch, skip, layer=i, nonneg=nonneg, seed=i, model_name="gpt2") for i in range(2)]
    save_transcoders(tcs, tmp_path / "set", format=fmt)
    back = load_transcoders(tmp_path / "set")
    assert [t.layer for t in back] == [0, 1]
    for a, b in zip(tcs, back, strict=True):
        same(a, b)
    x = torch.randn(3, D_IN)
    assert torch.equal(back[1](x), tcs[1](x))
    # saved again, the files are the same bytes
    save_transcoders(back, tmp_path / "again", format=fmt)
    files = sorted(p.relative_to(tmp_path / "set") for p in (tmp_path / "set").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "set" / f).read_bytes() == (tmp_path / "again" / f).read_bytes(), f


def test_save_model_and_from_pretrained(tmp_path: Path) -> None:
    tc = make("jumprelu", True, layer=1, dtype=torch.float64)
    weights, cfg_path = tc.save_model(tmp_path / "one")
    assert weights.name == "sae_weights.safetensors" and cfg_path.name == "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    assert cfg["architecture"] == "jumprelu_skip_transcoder" and cfg["apply_b_dec_to_input"] is False
    assert cfg["metadata"]["hook_name_out"] == "blocks.1.hook_mlp_out" and cfg["d_out"] == D_OUT
    same(tc, Transcoder.from_pretrained(tmp_path / "one"))
    assert Transcoder.from_pretrained(tmp_path / "one", dtype="float32").dtype == torch.float32
    assert Transcoder(cfg).cfg.architecture == "jumprelu" and Transcoder(cfg).cfg.skip  # a cfg.json's dict


def test_the_saelens_layout_on_disk(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tc = make("topk", True, layer=0)
    save_transcoders([tc], tmp_path / "s")
    w = load_file(tmp_path / "s" / "layer_0" / "sae_weights.safetensors")
    assert {k: tuple(v.shape) for k, v in w.items()} == {
        "W_enc": (D_IN, D_SAE),
        "W_dec": (D_SAE, D_OUT),
        "b_enc": (D_SAE,),
        "b_dec": (D_OUT,),
        "W_skip": (D_OUT, D_IN),
    }
    cfg = json.loads((tmp_path / "s" / "layer_0" / "cfg.json").read_text())
    assert (cfg["architecture"], cfg["k"]) == ("topk_skip_transcoder", 7)


def test_the_circuit_tracer_layout_on_disk(tmp_path: Path) -> None:
    import yaml
    from safetensors.torch import load_file

    tcs = [make("jumprelu", True, layer=i, nonneg=False, model_name="gpt2") for i in range(2)]
    save_transcoders(tcs, tmp_path / "ct", format="circuit-tracer")
    config = yaml.safe_load((tmp_path / "ct" / "config.yaml").read_text())
    assert config == {
        "model_name": "gpt2",
        "model_kind": "transcoder_set",
        "feature_input_hook": "ln2.hook_normalized",
        "feature_output_hook": "hook_mlp_out",
        "activation": "jumprelu",
        "model_processing": {"fold_ln": False, "center_writing_weights": False},  # raw weights: the default
    }
    w = load_file(tmp_path / "ct" / "layer_1.safetensors")
    assert {k: tuple(v.shape) for k, v in w.items()} == {
        "W_enc": (D_SAE, D_IN),  # circuit-tracer's F.linear layout
        "W_dec": (D_SAE, D_OUT),
        "b_enc": (D_SAE,),
        "b_dec": (D_OUT,),
        "W_skip": (D_OUT, D_IN),
        "activation_function.threshold": (D_SAE,),
    }
    assert torch.equal(w["W_enc"], tcs[1].W_enc.detach().T)


def ct_reference(w: dict[str, torch.Tensor], x: torch.Tensor, act: str, k: int | None = None) -> torch.Tensor:
    """circuit-tracer's SingleLayerTranscoder.forward, from its definitions (F.linear encoder)."""
    pre = torch.nn.functional.linear(x, w["W_enc"], w["b_enc"])
    if act == "relu":
        acts = torch.relu(pre)
    elif act == "jumprelu":
        acts = pre * (pre > w["activation_function.threshold"])
    else:
        _, idx = torch.topk(pre, k=k, dim=-1)  # type: ignore[arg-type]
        acts = pre * torch.zeros_like(pre).scatter_(-1, idx, 1)
    out = acts @ w["W_dec"] + w["b_dec"]
    return out + x @ w["W_skip"].T if "W_skip" in w else out


def write_ct_layer(path: Path, act: str, seed: int, skip: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = {
        "W_enc": torch.randn(D_SAE, D_IN, generator=g),
        "W_dec": torch.randn(D_SAE, D_OUT, generator=g),
        "b_enc": torch.randn(D_SAE, generator=g),
        "b_dec": torch.randn(D_OUT, generator=g),
    }
    if skip:
        w["W_skip"] = torch.randn(D_OUT, D_IN, generator=g)
    if act == "jumprelu":
        w["activation_function.threshold"] = torch.randn(D_SAE, generator=g)
    save_file(w, str(path))
    return w


@pytest.mark.parametrize("act", ["relu", "jumprelu", "topk"])
def test_a_hand_written_circuit_tracer_set_computes_its_numbers(tmp_path: Path, act: str) -> None:
    ws = [write_ct_layer(tmp_path / f"layer_{i}.safetensors", act, seed=i) for i in range(3)]
    lines = ["model_kind: transcoder_set", "feature_input_hook: hook_resid_mid", "feature_output_hook: mlp.hook_out"]
    lines += ["activation: topk", "k: 5"] if act == "topk" else []
    (tmp_path / "config.yaml").write_text("\n".join(lines) + "\n")
    tcs = load_transcoders(tmp_path / "config.yaml")
    assert [t.layer for t in tcs] == [0, 1, 2]
    assert tcs[2].input_hook == "blocks.2.hook_resid_mid" and tcs[2].output_hook == "blocks.2.hook_mlp_out"
    assert tcs[0].cfg.architecture == act and tcs[0].cfg.nonnegative_acts == (act == "relu")
    x = torch.randn(4, 6, D_IN)
    for w, tc in zip(ws, tcs, strict=True):
        torch.testing.assert_close(tc(x), ct_reference(w, x, act, k=5), rtol=1e-5, atol=1e-5)


def test_circuit_tracer_listed_files_older_entries_k_tensor_and_templates(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    w0 = write_ct_layer(tmp_path / "w" / "a.safetensors", "topk", seed=0, skip=False)
    w1 = write_ct_layer(tmp_path / "w" / "b.safetensors", "topk", seed=1, skip=False)
    save_file({**w1, "k": torch.tensor(4)}, str(tmp_path / "w" / "b.safetensors"))  # circuit-tracer's TopK writes k
    (tmp_path / "listed.yaml").write_text(
        "model_name: gpt2\nfeature_input_hook: mlp.hook_in\nfeature_output_hook: blocks.{layer}.hook_mlp_out\n"
        "activation: topk\nk: 4\ntranscoders:\n  - w/a.safetensors\n  - w/b.safetensors\n"
    )
    tcs = load_transcoders(tmp_path / "listed.yaml")
    # the MLP's input: ln2.hook_normalized only on folded weights, and the set is for raw ones (the default)
    assert [t.input_hook for t in tcs] == ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"]
    assert [t.output_hook for t in tcs] == ["blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out"]
    assert tcs[0].cfg.model_name == "gpt2" and tcs[1].cfg.k == 4
    x = torch.randn(5, D_IN)
    torch.testing.assert_close(tcs[0](x), ct_reference(w0, x, "topk", 4), rtol=1e-5, atol=1e-5)
    (tmp_path / "old.yaml").write_text(
        "model_name: gpt2\nfeature_input_hook: ln2.hook_normalized\nfeature_output_hook: hook_mlp_out\n"
        "activation_function: topk\ntranscoders:\n"
        "  - {id: b, layer: 3, filepath: w/b.safetensors}\n"
    )
    (old,) = load_transcoders(tmp_path / "old.yaml")  # k from the file's tensor
    assert (old.layer, old.cfg.k) == (3, 4)


def test_a_list_of_folders_and_a_folder_of_sae_lens_folders(tmp_path: Path) -> None:
    a, b = make("relu", False, layer=0), make("relu", False, layer=1)
    b.save_model(tmp_path / "b")
    a.save_model(tmp_path / "a")
    back = load_transcoders([tmp_path / "b", tmp_path / "a" / "cfg.json"])
    assert [t.layer for t in back] == [0, 1]
    same(a, back[0])
    save_transcoders([a, b], tmp_path / "set")
    assert sorted(p.name for p in (tmp_path / "set").iterdir()) == ["layer_0", "layer_1"]
    assert [t.layer for t in load_transcoders(tmp_path / "set")] == [0, 1]


def test_load_with_a_dtype_and_a_model_that_fits(tmp_path: Path, tiny_cfg) -> None:
    from interp_gpt import GPT

    tiny_cfg.model_name = "gpt2"
    model = GPT(tiny_cfg)
    tc = Transcoder(
        TranscoderConfig(d_in=64, d_sae=96, d_out=64, metadata={**meta(1), "model_name": "openai-community/gpt2"})
    )
    tc.save_model(tmp_path / "t")
    (back,) = load_transcoders(tmp_path / "t", model, dtype=torch.float64)
    assert back.dtype == torch.float64 and back.cfg.dtype == "float64"


# ------------------------------------------------------------------------------------------
# Whole or nothing
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["saelens", "circuit-tracer"])
def test_a_save_that_fails_midway_leaves_no_set_and_keeps_the_old_one(
    tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = [make("relu", True, layer=i, seed=10 + i) for i in range(2)]
    save_transcoders(old, tmp_path / "old", format=fmt)
    before = {p: p.read_bytes() for p in (tmp_path / "old").rglob("*") if p.is_file()}
    new = [make("relu", True, layer=i, seed=20 + i) for i in range(2)]

    from safetensors import torch as st

    real, calls = st.save_file, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "save_file", flaky)
    for target in (tmp_path / "fresh", tmp_path / "old"):
        calls.clear()
        with pytest.raises(OSError, match="No space left"):
            save_transcoders(new, target, format=fmt)
    assert not (tmp_path / "fresh").exists()
    assert {p: p.read_bytes() for p in (tmp_path / "old").rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no temporaries left behind
    monkeypatch.setattr(st, "save_file", real)
    save_transcoders(new, tmp_path / "old", format=fmt)  # a finished save replaces the old set
    same(new[1], load_transcoders(tmp_path / "old")[1])


def test_a_crash_between_renames_puts_the_old_set_back(tmp_path: Path) -> None:
    old = [make("relu", False, layer=0, seed=1)]
    save_transcoders(old, tmp_path / "s")
    tmp = tmp_path / "new"
    tmp.mkdir()
    calls = []

    def rename(a: Path, b: Path) -> None:
        calls.append(a)
        if a == tmp:
            raise OSError("cut")
        a.rename(b)

    with pytest.raises(OSError, match="cut"):
        files.swap_in(tmp, tmp_path / "s", rename=rename)
    same(old[0], load_transcoders(tmp_path / "s")[0])


def test_the_class_docstring_examples_run() -> None:
    """The examples on tiny-gpt2's shapes in TranscoderConfig, Transcoder, CLTConfig and
    CrossLayerTranscoder run as written."""
    import doctest

    from interp_gpt.sae import CLTConfig, CrossLayerTranscoder

    names = dict(torch=torch, Transcoder=Transcoder, TranscoderConfig=TranscoderConfig, CLTConfig=CLTConfig)
    names["CrossLayerTranscoder"] = CrossLayerTranscoder
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for obj in (TranscoderConfig, Transcoder, CLTConfig, CrossLayerTranscoder):
        for test in doctest.DocTestFinder(recurse=False).find(obj, globs=dict(names)):
            assert test.examples, obj
            runner.run(test)
    assert runner.failures == 0 and runner.tries >= 10


def test_a_set_for_tiny_gpt2_loads_against_it_and_reads_its_activations(tmp_path: Path) -> None:
    from interp_gpt import GPT

    model = GPT.from_pretrained("tiny-gpt2")
    tcs = []
    for layer in range(model.cfg.n_layers):
        cfg = TranscoderConfig(
            d_in=128, d_sae=256, d_out=128, architecture="topk", k=8, skip=True, nonnegative_acts=False,
            metadata={**meta(layer), "model_name": "tiny-gpt2"},
        )  # fmt: skip
        tcs.append(Transcoder(cfg))
    save_transcoders(tcs, tmp_path / "tiny", format="circuit-tracer")
    back = load_transcoders(tmp_path / "tiny", model)
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    for tc in back:
        out = tc(cache[tc.input_hook])
        assert out.shape == cache[tc.output_hook].shape == (1, 4, 128)


def _tiny_set(model, hook_in: str = "ln2.hook_normalized", skip: bool = True) -> list[Transcoder]:
    tcs = []
    for layer in range(model.cfg.n_layers):
        cfg = TranscoderConfig(
            d_in=128, d_sae=256, d_out=128, architecture="topk", k=8, skip=skip, nonnegative_acts=False,
            metadata={**meta(layer, hook_in), "model_name": "tiny-gpt2", "model_processing": "processed"},
        )  # fmt: skip
        tc = Transcoder(cfg)
        tc.init_weights(seed=layer)
        with torch.no_grad():
            tc.b_dec.normal_(generator=torch.Generator().manual_seed(10 + layer))
            if skip:
                tc.W_skip.normal_(generator=torch.Generator().manual_seed(20 + layer)).mul_(0.05)
        tcs.append(tc)
    return tcs


@pytest.mark.parametrize("hook_in", ["ln2.hook_normalized", "hook_resid_mid"])
def test_spliced_transcoders_replace_the_mlps_as_plain_hooks_would(hook_in: str) -> None:
    """Without the error term each MLP's output is the transcoder's prediction from that pass's own
    input (checked against plain hooks: read the input, overwrite hook_mlp_out); with it, the model's
    own output (to rounding: a watched ln2.hook_normalized leaves LayerNorm's fused path)."""
    from interp_gpt import GPT

    model = GPT.from_pretrained("tiny-gpt2")
    tcs = _tiny_set(model, hook_in)
    tokens = torch.tensor([[5, 17, 300, 42, 9, 1000], [7, 7, 8, 120, 64, 3]])
    plain = model(tokens)
    seen: dict[str, torch.Tensor] = {}

    def read(x: torch.Tensor, hook) -> None:
        seen[hook.name] = x

    def write(tc: Transcoder):
        return lambda out, hook: tc(seen[tc.input_hook])

    hooks = [(tc.input_hook, read) for tc in tcs] + [(tc.output_hook, write(tc)) for tc in tcs]
    want = model.run_with_hooks(tokens, fwd_hooks=hooks)
    assert not torch.allclose(want, plain, atol=1e-3)  # the transcoders do change the model
    with model.transcoders(tcs):
        got, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    feats = cache["blocks.1.hook_mlp_out.hook_sae_acts_post"]
    assert feats.shape == (2, 6, 256) and int((feats != 0).sum(-1).max()) <= 8
    with model.transcoders(tcs, use_error_term=True):
        torch.testing.assert_close(model(tokens), plain, atol=1e-5, rtol=1e-5)
    assert model.acts_to_saes == {} and torch.equal(model(tokens), plain)


def test_a_transcoder_for_another_model_or_a_missing_layer_is_refused_when_spliced() -> None:
    from interp_gpt import GPT

    model = GPT.from_pretrained("tiny-gpt2")
    other = make("relu", False, layer=0, model_name="gpt2")
    with pytest.raises(ValueError, match=r"is for 'gpt2' .* but the model is 'tiny-gpt2'"):
        with model.transcoders([other]):
            pass
    deep = _tiny_set(model)[0]
    deep.cfg.metadata.update(hook_name="blocks.5.ln2.hook_normalized", hook_name_out="blocks.5.hook_mlp_out")
    with pytest.raises(ValueError, match=r"layer 5 does not exist: the model's layers are 0..1"):
        with model.transcoders([deep]):
            pass
    assert model.acts_to_saes == {}


def test_a_saved_set_is_a_folder_others_can_read_as_a_new_folder_would_be(tmp_path: Path) -> None:
    """The set is written in a temporary folder (mkdtemp makes it 0700) and renamed into place: it gets
    the permissions a new folder gets under the umask, and an old folder's when it replaces one."""
    import os

    from interp_gpt.sae import CLTConfig, CrossLayerTranscoder, save_clt

    umask = os.umask(0o022)
    try:
        save_transcoders([make("relu", False, layer=0)], tmp_path / "s")
        save_transcoders([make("relu", False, layer=0)], tmp_path / "c", format="circuit-tracer")
        clt = CrossLayerTranscoder(
            CLTConfig(
                n_layers=2,
                d_in=D_IN,
                d_sae=D_SAE,
                d_out=D_OUT,
                metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"},
            )
        )
        save_clt(clt, tmp_path / "clt")
        for name in ("s", "c", "clt"):
            assert (tmp_path / name).stat().st_mode & 0o777 == 0o755, name
        os.chmod(tmp_path / "s", 0o750)
        save_transcoders([make("relu", False, layer=0, seed=3)], tmp_path / "s")
        assert (tmp_path / "s").stat().st_mode & 0o777 == 0o750
    finally:
        os.umask(umask)
