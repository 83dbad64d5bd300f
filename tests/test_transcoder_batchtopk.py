"""BatchTopK transcoders: a JumpReLU transcoder (or CLT) whose metadata says `batchtopk_metadata(k)` trains
with the SAE's BatchTopK selection (the int(k * n) largest over a batch), TopK's loss and the SAE's
running threshold, and is saved and loaded as the JumpReLU with that threshold for every feature;
`interp-gpt train-transcoder --architecture batchtopk` writes such a set. Bad k and misuse are refused
by name. (No Matryoshka transcoder: see the issue.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from interp_gpt.cli import main as cli_main
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
from interp_gpt.sae.saes.evaluation import explained_variance
from interp_gpt.sae.training.transcoder_trainer import TranscoderTrainer, TranscoderTrainingConfig
from interp_gpt.sae.transcoders.config import batchtopk_k, batchtopk_metadata

try:
    import sae_lens
except ImportError:  # sae-lens needs transformer-lens < 4
    sae_lens = None

needs_sae_lens = pytest.mark.skipif(
    sae_lens is None, reason="sae-lens is not installed here; CI's transformer-lens 3.9 venv (.venv-tl3) has it"
)

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: small matrices run faster on one thread)


def meta(layer: int, k: float) -> dict[str, Any]:
    hooks = {"hook_name": f"blocks.{layer}.ln2.hook_normalized", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}
    return {**hooks, **batchtopk_metadata(k)}


def btk(k: float = 2.5, layer: int = 0, skip: bool = False, d: int = 16, d_sae: int = 48) -> Transcoder:
    cfg = TranscoderConfig(d_in=d, d_sae=d_sae, d_out=d, architecture="jumprelu", skip=skip, metadata=meta(layer, k))
    return Transcoder(cfg)


def planted(n: int = 20_000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, output directions): sparse mixtures (~1.4 of 24 per row) of 24 input directions,
    the targets the same mixtures of 24 output directions."""
    g = torch.Generator().manual_seed(seed)
    d_in, d_out = (F.normalize(torch.randn(24, 16, generator=g), dim=-1) for _ in range(2))
    c = (torch.rand(n, 24, generator=g) < 0.06) * (1 + torch.rand(n, 24, generator=g))
    return c @ d_in, c @ d_out, d_out


def batches(x: torch.Tensor, y: torch.Tensor, size: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    while True:
        order = torch.randperm(x.shape[-2], generator=g)
        for i in range(0, x.shape[-2] - size + 1, size):
            yield x[..., order[i : i + size], :], y[..., order[i : i + size], :]


def gate(tc: Transcoder, x: torch.Tensor) -> torch.Tensor:
    """The inference form by hand: h * (h > threshold), decoded (plus the skip)."""
    h = x @ tc.W_enc + tc.b_enc
    y = (h * (h > tc.threshold)) @ tc.W_dec + tc.b_dec
    return y + x @ tc.W_skip.T if tc.cfg.skip else y


# ----------------------------------------------------------------------------------------------
# the selection and the running threshold
# ----------------------------------------------------------------------------------------------
def test_a_step_keeps_the_int_k_n_largest_over_the_batch_and_moves_the_threshold_per_the_formula() -> None:
    """Two layers (each its own selection and threshold), k=2.5 on 7 rows: int(17.5) = 17 kept per layer,
    the batch's 17 largest ReLU'd pre-activations, rows keeping unequal counts; after each step
    threshold <- (1 - lr) * threshold + lr * min(kept), float64, written into every feature's threshold."""
    tcs = [btk(2.5, layer) for layer in range(2)]
    with torch.no_grad():
        for tc in tcs:
            tc.threshold.fill_(0.7)  # the initialisation of step 1 starts the running threshold at 0
    lr = 0.3
    trainer = TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=1e-2, topk_threshold_lr=lr))
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(2, 7, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    expected = torch.zeros(2, dtype=torch.float64)  # the running threshold starts at 0
    for step in range(3):
        if step:  # (step 0 initialises the weights first)
            pre = torch.stack([xs[s] @ tc.W_enc + tc.b_enc for s, tc in enumerate(tcs)]).detach()
        parts = trainer.step((xs, ys))
        feats = parts["feats"]
        for s in range(2):
            kept = feats[s][feats[s] != 0]
            assert kept.numel() == 17
            if step:
                want = pre[s].relu().flatten().topk(17).values
                torch.testing.assert_close(kept.sort().values, want.sort().values)
                expected[s] = (1 - lr) * expected[s] + lr * want.min().to(torch.float64)
            else:  # (the initial weights are gone: the kept values are what they gave)
                expected[s] = lr * kept.min().to(torch.float64)
        counts = (feats != 0).sum(-1)
        assert counts.sum(-1).tolist() == [17, 17] and len(set(counts.flatten().tolist())) > 1  # not k per row
        torch.testing.assert_close(trainer.topk_threshold, expected, rtol=1e-12, atol=0)
        assert trainer.topk_threshold.dtype == torch.float64
        for s, tc in enumerate(tcs):
            assert torch.equal(tc.threshold.detach(), torch.full((48,), float(expected[s]), dtype=torch.float32))
    assert float(expected[0]) != float(expected[1])  # each layer its own
    entry = trainer._entry((xs, ys), parts)
    assert entry["topk_threshold.1"] == float(expected[1]) and entry["l0"] == pytest.approx(17 / 7)


def test_a_batch_without_positive_pre_activations_keeps_the_threshold() -> None:
    tc = btk(2.0)
    with torch.no_grad():
        tc.threshold.fill_(0.25)
        tc.b_enc.fill_(-100.0)  # nothing positive: nothing kept
    trainer = TranscoderTrainer(tc, TranscoderTrainingConfig(init_weights=False, topk_threshold_lr=0.5))
    assert trainer.topk_threshold.tolist() == [0.25]  # continues from the transcoder's own
    parts = trainer.step((torch.randn(8, 16), torch.randn(8, 16)))
    assert int((parts["feats"] != 0).sum()) == 0
    assert trainer.topk_threshold.tolist() == [0.25] and bool((tc.threshold == 0.25).all())


def test_a_diverged_step_rolls_the_running_threshold_back_with_the_weights() -> None:
    from interp_gpt.sae.training.sae_trainer import NonFiniteTrainingError

    tc = btk(2.0)
    trainer = TranscoderTrainer(tc, TranscoderTrainingConfig(lr=1e-2, log_every=2, topk_threshold_lr=0.5))
    g = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(3):  # the last good state is kept before steps 1 and 3: the state after step 2
        trainer.step((torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)))
        seen.append(trainer.topk_threshold.clone())
    assert float(seen[2]) != float(seen[1])
    with torch.no_grad():
        tc.b_dec[0] = float("inf")  # the next loss is not finite on a finite batch
    with pytest.raises(NonFiniteTrainingError, match="state after step 2"):
        trainer.step((torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)))
    assert torch.equal(trainer.topk_threshold, seen[1])
    assert bool((tc.threshold == float(seen[1])).all())


# ----------------------------------------------------------------------------------------------
# it learns, and the saved JumpReLU computes what the trained one does
# ----------------------------------------------------------------------------------------------
def test_batchtopk_transcoder_learns_planted_directions_with_an_average_l0_near_k() -> None:
    x, y, d_out = planted()
    tc = btk(2.0)
    log = TranscoderTrainer(tc, TranscoderTrainingConfig(lr=1e-2)).train(batches(x, y), n_steps=300, progress=False)
    assert log[-1]["explained_variance"] > 0.9 and log[-1]["l0"] == 2.0  # the training form: exactly k on average
    with torch.no_grad():  # the inference form (the threshold gate) on rows it did not train on last
        feats, y_hat = tc.encode(x[-4000:]), tc(x[-4000:])
    assert explained_variance(y[-4000:], y_hat) > 0.85
    l0 = float((feats != 0).float().sum(-1).mean())
    assert 1.4 < l0 < 2.6, l0
    best = (F.normalize(tc.W_dec.detach(), dim=-1) @ d_out.T).max(0).values
    assert (best > 0.9).float().mean() >= 0.8
    threshold = tc.threshold.detach()
    assert bool((threshold == threshold[0]).all()) and float(threshold[0]) > 0.1  # one value, learnt
    assert tc.cfg.architecture == "jumprelu" and batchtopk_k(tc.cfg) == 2.0


@pytest.mark.parametrize("skip", [False, True])
def test_saved_and_loaded_as_jumprelu_with_equal_outputs(tmp_path: Path, skip: bool) -> None:
    x, y, _ = planted(4096)
    tcs = [btk(3.5, layer, skip=skip) for layer in range(2)]
    TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=1e-2)).train(
        batches(x.expand(2, -1, -1), y.expand(2, -1, -1)), n_steps=40, progress=False
    )
    probe = x[:512]
    with torch.no_grad():
        want = [tc(probe) for tc in tcs]
        for tc, w in zip(tcs, want, strict=True):
            assert torch.equal(w, gate(tc, probe))  # the trained one computes the threshold gate
            assert 0 < float((tc.encode(probe) != 0).float().mean()) < 0.5
    for fmt in ("saelens", "circuit-tracer"):
        folder = save_transcoders(tcs, tmp_path / fmt, format=fmt)
        back = load_transcoders(folder)
        assert [t.layer for t in back] == [0, 1]
        for tc, b, w in zip(tcs, back, want, strict=True):
            assert b.cfg.architecture == "jumprelu" and b.cfg.skip == skip
            assert torch.equal(b.threshold, tc.threshold.detach())
            with torch.no_grad():
                assert torch.equal(b(probe), w), fmt
    on_disk = json.loads((tmp_path / "saelens" / "layer_1" / "cfg.json").read_text())
    assert on_disk["architecture"] == ("jumprelu_skip_transcoder" if skip else "jumprelu_transcoder")
    assert on_disk["metadata"]["training_architecture"] == "batchtopk"
    assert on_disk["metadata"]["training_architecture_details"] == {"k": 3.5}
    assert batchtopk_k(load_transcoders(tmp_path / "saelens")[0].cfg) == 3.5  # trains on as BatchTopK


@needs_sae_lens
def test_sae_lens_loads_the_saved_transcoder_as_its_jumprelu_skip_transcoder(tmp_path: Path) -> None:
    x, y, _ = planted(4096)
    tc = btk(3.0, 1, skip=True)
    TranscoderTrainer(tc, TranscoderTrainingConfig(lr=1e-2)).train(batches(x, y), n_steps=30, progress=False)
    tc.save_model(tmp_path / "ours")
    twin = sae_lens.SAE.load_from_disk(str(tmp_path / "ours"))  # type: ignore[union-attr]
    assert type(twin).__name__ == "JumpReLUSkipTranscoder"
    with torch.no_grad():
        torch.testing.assert_close(twin(x[:256]), tc(x[:256]), rtol=1e-6, atol=1e-6)


def test_a_clt_trains_as_batchtopk_with_a_threshold_per_layer_and_saves_as_jumprelu(tmp_path: Path) -> None:
    x, y, _ = planted(4096)
    m = {"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out", **batchtopk_metadata(2.5)}
    cfg = CLTConfig(n_layers=2, d_in=16, d_sae=32, d_out=16, architecture="jumprelu", metadata=m)
    clt = CrossLayerTranscoder(cfg)
    xs, ys = torch.stack([x, x.roll(1, 0)]), torch.stack([y, y + y.roll(1, 0)])
    trainer = TranscoderTrainer(clt, TranscoderTrainingConfig(lr=1e-2))
    log = trainer.train(batches(xs, ys), n_steps=40, progress=False)
    assert log[-1]["l0"] == 2.5 and log[-1]["explained_variance"] > 0.3
    threshold = clt.threshold.detach()
    for s in range(2):
        assert bool((threshold[s] == float(trainer.topk_threshold[s])).all()) and float(threshold[s, 0]) > 0
    assert float(threshold[0, 0]) != float(threshold[1, 0])
    save_clt(clt, tmp_path / "clt")
    back = load_clt(tmp_path / "clt")
    assert back.cfg.architecture == "jumprelu"
    with torch.no_grad():
        assert torch.equal(back.decode(back.encode(xs[:, :64])), clt.decode(clt.encode(xs[:, :64])))


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        (dict(k=49), ValueError, r"metadata.training_architecture_details.k=49: expected a number > 0 and <= d_sae=48"),
        (dict(k=0), ValueError, r"k=0: expected a number > 0"),
        (dict(k=-1.5), ValueError, r"k=-1.5: expected a number > 0"),
        (dict(k=float("nan")), ValueError, r"k=nan: expected a number > 0"),
        (dict(k="4"), TypeError, r"k='4': expected a number > 0"),
        (dict(k=True), TypeError, r"k=True: expected a number > 0"),
    ],
)
def test_bad_k_is_refused_by_name(kw: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):  # from batchtopk_metadata, or from the config (d_sae)
        btk(**kw)
    if kw["k"] == 49:  # a CLT's config checks it as a PLT's
        clt_meta = {"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out", **batchtopk_metadata(49)}
        with pytest.raises(ValueError, match=match):
            CLTConfig(n_layers=2, d_in=16, d_sae=48, d_out=16, architecture="jumprelu", metadata=clt_meta)


def test_batchtopk_misuse_is_refused_by_name() -> None:
    base: dict[str, Any] = {"d_in": 16, "d_sae": 48, "d_out": 16}
    with pytest.raises(ValueError, match=r"architecture='batchtopk' is not a transcoder architecture.*"
                       r"pass architecture='jumprelu' and metadata with batchtopk_metadata\(k\)"):  # fmt: skip
        TranscoderConfig(**base, architecture="batchtopk", k=4)
    with pytest.raises(ValueError, match=r"architecture='batchtopk' is not a transcoder architecture"):
        CLTConfig(n_layers=2, **base, architecture="batchtopk", k=4)
    with pytest.raises(ValueError, match=r"training_architecture='batchtopk' trains a JumpReLU.*architecture='topk'"):
        TranscoderConfig(**base, architecture="topk", k=4, metadata=batchtopk_metadata(4))
    hooks = {"hook_name": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out"}
    for how in ("matryoshka_batchtopk", "jumprelu"):  # another training is a file's history: it loads ...
        history = hooks | {"training_architecture": how}
        tc = Transcoder(TranscoderConfig(**base, architecture="jumprelu", metadata=history))
        if how == "jumprelu":  # ... and trains as its JumpReLU
            assert TranscoderTrainer(tc).training_architecture == "jumprelu"
        else:  # ... but one this package does not train is refused by name
            with pytest.raises(ValueError, match=r"training_architecture='matryoshka_batchtopk': a JumpReLU trained"):
                TranscoderTrainer(tc)
    with pytest.raises(ValueError, match=r"training_architecture_details=None: a batchtopk transcoder needs"):
        TranscoderConfig(**base, architecture="jumprelu", metadata={"training_architecture": "batchtopk"})
    with pytest.raises(
        ValueError,
        match=r"transcoders\[1\] trains as BatchTopK \(k=3.0\) but transcoders\[0\] as BatchTopK \(k=2.0\)",
    ):
        TranscoderTrainer([btk(2, 0), btk(3, 1)])
    plain = Transcoder(TranscoderConfig(**base, architecture="jumprelu", metadata=hooks))
    with pytest.raises(
        ValueError, match=r"transcoders\[1\] trains as jumprelu but transcoders\[0\] as BatchTopK \(k=2.0\)"
    ):
        TranscoderTrainer([btk(2, 0), plain])


# ----------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text(CORPUS.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    return folder


def argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train-transcoder", "--data", str(data), "--d-sae", "32", "--architecture", "batchtopk",
            "--batch-size", "128", "--n-tokens", "384", "--context-size", "32", "--val-windows", "2",
            "--no-progress", "--out", str(out), *extra]  # fmt: skip


@pytest.mark.parametrize("kind", ["skip", "clt"])
def test_train_transcoder_batchtopk_writes_a_jumprelu_set_that_loads(data_dir: Path, tmp_path: Path, kind: str) -> None:
    from interp_gpt.loading import from_pretrained
    from interp_gpt.sae.transcoders.evaluation import evaluate_transcoders

    out = tmp_path / kind
    assert cli_main(argv(data_dir, out, "--kind", kind, "--k", "2.5")) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["architecture"] == "batchtopk" and metrics["steps"] == 3
    loaded: Any = load_clt(out) if kind == "clt" else load_transcoders(out)
    cfgs = [loaded.cfg] if kind == "clt" else [tc.cfg for tc in loaded]
    assert all(c.architecture == "jumprelu" for c in cfgs)
    # sae-lens' cfg.json keeps how it was trained; circuit-tracer's CLT config.yaml has no place for it
    assert [batchtopk_k(c) for c in cfgs] == ([None] if kind == "clt" else [2.5, 2.5])
    thresholds = [loaded.threshold] if kind == "clt" else [tc.threshold for tc in loaded]
    assert all(bool((t > 0).all()) for t in thresholds)  # the running threshold after 3 steps
    model = from_pretrained("tiny-gpt2")
    from interp_gpt.sae.training import split_corpus, token_windows

    again = evaluate_transcoders(model, loaded, token_windows(model, split_corpus(data_dir)[1], 32, 2))
    for key in ("ce_loss_recovered", "explained_variance", "l0"):  # the saved set is the one evaluated
        assert again[key] == pytest.approx(metrics["validation"][key], rel=1e-5, abs=1e-6), key


def _no(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("work began before every input was checked")


@pytest.mark.parametrize(
    ("k", "match"),
    [
        ("33", "--k=33 is out of range: expected a number > 0 and <= --d-sae=32"),
        ("32.5", "--k=32.5 is out of range: expected a number > 0 and <= --d-sae=32"),
        ("0", "--k=0 is out of range"),
        ("-2", "--k=-2 is out of range"),
        ("nan", "--k=nan is out of range"),
        ("four", "argument --k: expected a number (an int; a float for batchtopk), got 'four'"),
    ],
)
def test_bad_k_on_the_command_line_is_one_line_before_the_model_loads(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    k: str, match: str,
) -> None:  # fmt: skip
    import interp_gpt.loading

    monkeypatch.setattr(interp_gpt.loading, "from_pretrained", _no)
    assert cli_main(argv(data_dir, tmp_path / "t", "--k", k)) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err, err
    assert not (tmp_path / "t").exists()


def test_a_float_k_is_refused_for_topk_on_the_command_line(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import interp_gpt.loading

    monkeypatch.setattr(interp_gpt.loading, "from_pretrained", _no)
    assert cli_main(argv(data_dir, tmp_path / "t", "--k", "2.5", "--architecture", "topk")) == 2
    assert "--k" in capsys.readouterr().err
