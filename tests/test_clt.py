"""Cross-layer transcoders: numbers against an einsum reference written here (each layer's output sums
the decoders of every earlier layer's features), one layer at a time equal to all at once, hook
points, circuit-tracer's CLT folder (hand-written here with its layout), round trips, and bad input."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from interp_gpt.checkpoints.sources import CheckpointError
from interp_gpt.sae import CLTConfig, CrossLayerTranscoder, load_clt, load_transcoders, save_clt

N, D_IN, D_SAE, D_OUT = 3, 12, 20, 10
HOOKS = {"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"}


def make(arch: str = "relu", skip: bool = False, nonneg: bool = True, seed: int = 0, **kw) -> CrossLayerTranscoder:
    cfg = CLTConfig(
        n_layers=N,
        d_in=D_IN,
        d_sae=D_SAE,
        d_out=D_OUT,
        architecture=arch,
        skip=skip,
        k=5 if arch == "topk" else None,
        nonnegative_acts=nonneg,
        metadata={**HOOKS, "model_name": "gpt2"},
        **kw,
    )
    clt = CrossLayerTranscoder(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clt.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        if arch == "topk":
            clt.b_enc -= 1.5  # some of the k largest are negative
    return clt


def reference(clt: CrossLayerTranscoder, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(acts [n, ..., d_sae], outs [n, ..., d_out]) from the definitions, in float64."""
    p = {k: v.detach().double() for k, v in clt.state_dict().items()}
    xs = xs.double()
    pre = torch.einsum("l...i,lis->l...s", xs, p["W_enc"]) + p["b_enc"].view(N, *[1] * (xs.ndim - 2), D_SAE)
    c = clt.cfg
    if c.architecture == "relu":
        acts = pre.clamp(min=0)
    elif c.architecture == "jumprelu":
        thr = p["threshold"].view(N, *[1] * (xs.ndim - 2), D_SAE)
        acts = torch.where(pre > thr, pre, torch.zeros_like(pre))
    else:
        kth = pre.sort(dim=-1, descending=True).values[..., c.k - 1 : c.k]
        acts = torch.where(pre >= kth, pre, torch.zeros_like(pre))
    if c.nonnegative_acts:
        acts = acts.clamp(min=0)
    outs = []
    for m in range(N):
        out = p["b_dec"][m] + sum(
            torch.einsum("...s,so->...o", acts[s], p[f"W_dec.{s}"][:, m - s]) for s in range(m + 1)
        )
        if c.skip:
            out = out + torch.einsum("...i,oi->...o", xs[m], p["W_skip"][m])
        outs.append(out)
    return acts, torch.stack(outs)


VARIANTS = [
    (a, s, n)
    for a, s, n in itertools.product(("relu", "jumprelu", "topk"), (False, True), (True, False))
    if a != "relu" or n
]


@pytest.mark.parametrize("arch,skip,nonneg", VARIANTS)
def test_clt_equals_the_definitions_all_at_once_and_layer_by_layer(arch: str, skip: bool, nonneg: bool) -> None:
    clt = make(arch, skip, nonneg, dtype="float64")
    xs = torch.randn(N, 2, 4, D_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref_acts, ref_out = reference(clt, xs)
    acts = clt.encode(xs)
    torch.testing.assert_close(acts, ref_acts, rtol=0, atol=1e-12)
    torch.testing.assert_close(clt.decode(acts, xs), ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(clt(xs), ref_out, rtol=0, atol=1e-12)
    for m in range(N):  # as a splice calls it: layer m's output from the features of layers 0..m only
        layer_acts = torch.stack([clt.encode_layer(xs[s], s) for s in range(m + 1)])
        torch.testing.assert_close(clt.decode_layer(layer_acts, m, xs[m]), ref_out[m], rtol=0, atol=1e-12)
    if arch != "relu" and not nonneg:
        assert (acts < 0).any()


def test_each_layer_has_its_hook_points() -> None:
    clt = make("jumprelu")
    assert clt.input_hook(2) == "blocks.2.ln2.hook_normalized" and clt.output_hook(0) == "blocks.0.hook_mlp_out"
    seen: list[str] = []
    for i in range(N):
        for name in clt.hook_names:
            getattr(clt.layers[i], name).add_hook(lambda t, hook: seen.append(hook.name))
    xs = torch.randn(N, 2, D_IN)
    clt(xs)
    assert {f"layers.{i}.{n}" for i in range(N) for n in clt.hook_names} == set(seen)
    # zeroing layer 0's features takes its decoders out of every later layer
    clt.layers[0].hook_sae_acts_post.add_hook(lambda t, hook: torch.zeros_like(t))
    acts = clt.encode(xs)
    assert not acts[0].any()


@pytest.mark.parametrize("arch,skip,nonneg", VARIANTS)
def test_clt_round_trips_bit_for_bit(tmp_path: Path, arch: str, skip: bool, nonneg: bool) -> None:
    clt = make(arch, skip, nonneg)
    save_clt(clt, tmp_path / "clt")
    back = load_clt(tmp_path / "clt")
    assert back.state_dict().keys() == clt.state_dict().keys()
    for k, v in clt.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    for f in ("n_layers", "d_in", "d_sae", "d_out", "architecture", "skip", "k", "nonnegative_acts", "dtype"):
        assert getattr(back.cfg, f) == getattr(clt.cfg, f), f
    assert back.cfg.metadata["hook_name"] == "ln2.hook_normalized" and back.cfg.model_name == "gpt2"
    import yaml

    kind = yaml.safe_load((tmp_path / "clt" / "config.yaml").read_text())["model_kind"]
    exact = not skip and (arch == "relu" or (arch == "jumprelu" and not nonneg))  # thresholds straddle 0
    assert kind == ("cross_layer_transcoder" if exact else "interp_gpt.cross_layer_transcoder")
    assert load_clt(tmp_path / "clt", dtype="float64").dtype == torch.float64


def test_a_hand_written_circuit_tracer_clt_computes_its_numbers(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    W_enc = torch.randn(N, D_SAE, D_IN, generator=g)  # its layout: [n_layers, d_transcoder, d_model]
    b_enc, b_dec = torch.randn(N, D_SAE, generator=g), torch.randn(N, D_OUT, generator=g)
    thr = torch.randn(N, D_SAE, generator=g)
    W_dec = [torch.randn(D_SAE, N - i, D_OUT, generator=g) for i in range(N)]
    for i in range(N):
        save_file(
            {f"W_enc_{i}": W_enc[i], f"b_enc_{i}": b_enc[i], f"b_dec_{i}": b_dec[i], f"threshold_{i}": thr[i]},
            str(tmp_path / f"W_enc_{i}.safetensors"),
        )
        save_file({f"W_dec_{i}": W_dec[i]}, str(tmp_path / f"W_dec_{i}.safetensors"))
    (tmp_path / "config.yaml").write_text(
        "model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\n"
    )
    clt = load_clt(tmp_path)
    assert clt.cfg.architecture == "jumprelu" and not clt.cfg.nonnegative_acts
    xs = torch.randn(N, 6, D_IN, generator=g)
    # circuit-tracer's CrossLayerTranscoder: einsum("lbd,lfd->lbf") + b_enc, x * (x > threshold), then
    # each layer's decoder rows added into layers l.. and b_dec
    feats = torch.einsum("lbd,lfd->lbf", xs, W_enc) + b_enc[:, None]
    feats = feats * (feats > thr[:, None])
    recon = b_dec[:, None].repeat(1, 6, 1)
    for s in range(N):
        recon[s:] += torch.einsum("bf,flo->lbo", feats[s], W_dec[s])
    torch.testing.assert_close(clt.encode(xs), feats, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(clt(xs), recon, rtol=1e-5, atol=1e-5)
    assert clt.input_hook(1) == "blocks.1.hook_resid_mid"


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields,error,match",
    [
        (dict(n_layers=0), ValueError, r"n_layers=0: expected a positive integer"),
        (dict(n_layers="3"), TypeError, r"n_layers='3': expected a positive integer"),
        (dict(architecture="topk"), ValueError, r"^k: a topk transcoder needs k"),
        (dict(skip="yes"), TypeError, r"skip='yes': expected a boolean"),
        (
            dict(metadata={"hook_name": "blocks.0.ln2.hook_normalized"}),
            ValueError,
            r"metadata.hook_name='blocks.0.ln2.hook_normalized': a CLT reads and writes every layer",
        ),
    ],
)
def test_a_bad_clt_config_is_refused_by_field(fields: dict, error: type, match: str) -> None:
    base = dict(n_layers=N, d_in=D_IN, d_sae=D_SAE, d_out=D_OUT, metadata=dict(HOOKS))
    with pytest.raises(error, match=match):
        CLTConfig(**{**base, **fields})


def test_bad_clt_calls_are_refused_by_name() -> None:
    clt = make(skip=True)
    with pytest.raises(ValueError, match=r"encode_layer: layer=3; the CLT's layers are 0..2"):
        clt.encode_layer(torch.zeros(D_IN), 3)
    with pytest.raises(ValueError, match=r"encode_layer: x has shape \(2, 64\); expected \[\.\.\., d_in=12\]"):
        clt.encode_layer(torch.zeros(2, 64), 0)
    with pytest.raises(ValueError, match=r"encode: xs holds 2 layers; expected n_layers=3"):
        clt.encode(torch.zeros(2, 4, D_IN))
    with pytest.raises(ValueError, match=r"decode_layer: acts holds 1 layers; layer 2 needs layers 0..2"):
        clt.decode_layer(torch.zeros(1, D_SAE), 2, torch.zeros(D_IN))
    with pytest.raises(ValueError, match=r"decode_layer: x: a skip CLT adds x @ W_skip\[layer\].T"):
        clt.decode_layer(torch.zeros(N, D_SAE), 0)
    with pytest.raises(ValueError, match=r"decode: xs: a skip CLT needs every layer's input"):
        clt.decode(torch.zeros(N, D_SAE))
    with pytest.raises(TypeError, match=r"encode_layer: x: expected a float tensor \[\.\.\., d_in=12\], got list"):
        clt.encode_layer([0.0] * D_IN, 0)  # type: ignore[arg-type]


def test_bad_clt_files_are_refused_by_name(tmp_path: Path) -> None:
    save_clt(make("jumprelu", nonneg=False), tmp_path / "c")
    with pytest.raises(CheckpointError, match=r"model_kind='cross_layer_transcoder': load_transcoders reads per-layer"):
        load_transcoders(tmp_path / "c")
    w = load_file(tmp_path / "c" / "W_dec_1.safetensors")
    save_file({"W_dec_1": w["W_dec_1"][:, :1].contiguous()}, str(tmp_path / "c" / "W_dec_1.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"W_dec_1.safetensors: mis-shaped W_dec_1 \(20, 1, 10\) \(expected \(20, 2, 10\)\)"
    ):
        load_clt(tmp_path / "c")
    save_file(w, str(tmp_path / "c" / "W_dec_1.safetensors"))
    w = load_file(tmp_path / "c" / "W_enc_2.safetensors")
    w["b_enc_2"][0] = float("nan")
    save_file(w, str(tmp_path / "c" / "W_enc_2.safetensors"))
    with pytest.raises(CheckpointError, match=r"W_enc_2.safetensors: tensor 'b_enc_2' holds non-finite"):
        load_clt(tmp_path / "c" / "config.yaml")
    del w["threshold_2"]
    save_file(w, str(tmp_path / "c" / "W_enc_2.safetensors"))
    with pytest.raises(CheckpointError, match=r"W_enc_2.safetensors: missing \['threshold_2'\]"):
        load_clt(tmp_path / "c" / "config.yaml")
    (tmp_path / "c" / "W_dec_0.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"layer 0's W_dec_0.safetensors is missing"):
        load_clt(tmp_path / "c")
    (tmp_path / "c" / "config.yaml").write_text("model_kind: transcoder_set\n")
    with pytest.raises(CheckpointError, match=r"model_kind='transcoder_set'; expected 'cross_layer_transcoder'"):
        load_clt(tmp_path / "c")
    with pytest.raises(
        FileNotFoundError, match=r"load_clt: .*nowhere' does not exist \(a CLT folder holds config.yaml\)"
    ):
        load_clt(tmp_path / "nowhere")
    with pytest.raises(TypeError, match=r"save_clt: clt: expected a CrossLayerTranscoder, got int"):
        save_clt(3, tmp_path / "d")  # type: ignore[arg-type]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match=r"save_clt: path=.*holds other files"):
        save_clt(make(), tmp_path / "d")
