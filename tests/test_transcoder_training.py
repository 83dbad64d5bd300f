"""TranscoderTrainer recovers planted directions (PLT, skip, CLT, JumpReLU), its JumpReLU estimators have
the gradients of their definition, NaN batches are refused, evaluate_transcoders equals plain hooks, and
`interp-gpt train-transcoder` writes a set that loads, with its metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from interp_gpt.loading import from_pretrained
from interp_gpt.sae import (
    CLTConfig,
    CrossLayerTranscoder,
    Transcoder,
    TranscoderConfig,
    load_clt,
    load_transcoders,
)
from interp_gpt.sae.training.sae_trainer import NonFiniteTrainingError
from interp_gpt.sae.training.transcoder_trainer import (
    TranscoderTrainer,
    TranscoderTrainingConfig,
    _Heaviside,
    _JumpGate,
)
from interp_gpt.sae.transcoders.evaluation import evaluate_transcoders

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def unit(n: int, d: int, g: torch.Generator) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=g), dim=-1)


def codes(n: int, n_true: int, p: float, g: torch.Generator) -> torch.Tensor:
    """Sparse non-negative feature coefficients [n, n_true]."""
    return (torch.rand(n, n_true, generator=g) < p) * (1 + torch.rand(n, n_true, generator=g))


def batches(
    x: torch.Tensor, y: torch.Tensor, size: int = 256, seed: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled (inputs, targets) batches; rows on the second-to-last axis."""
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(x.shape[-2], generator=g)
        for i in range(0, x.shape[-2] - size + 1, size):
            idx = order[i : i + size]
            yield x[..., idx, :], y[..., idx, :]


def recovered(w_dec: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """For each planted (flattened) decoder direction, its best cosine with a learned decoder row."""
    return (F.normalize(w_dec.detach().flatten(1), dim=-1) @ F.normalize(true.flatten(1), dim=-1).T).max(0).values


def plt(arch: str = "topk", skip: bool = False, d: int = 16, d_sae: int = 48, **kw: Any) -> Transcoder:
    if arch == "topk":
        kw.setdefault("k", 4)
    return Transcoder(TranscoderConfig(d_in=d, d_sae=d_sae, d_out=d, architecture=arch, skip=skip, **kw))


# ----------------------------------------------------------------------------------------------
# planted directions
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "cfg"),
    [
        ("topk", TranscoderTrainingConfig(lr=3e-3)),
        ("relu", TranscoderTrainingConfig(lr=3e-3, l1_coefficient=0.5)),
        (
            "jumprelu",
            TranscoderTrainingConfig(lr=3e-3, l0_coefficient=0.1, jumprelu_bandwidth=0.2, jumprelu_init_threshold=0.5),
        ),
    ],
)
def test_plt_recovers_the_planted_output_directions(arch: str, cfg: TranscoderTrainingConfig) -> None:
    """Inputs are sparse mixtures of 24 input directions, targets the same mixtures of 24 other (output)
    directions: the decoder must learn the output directions."""
    g = torch.Generator().manual_seed(0)
    d_in, d_out = unit(24, 16, g), unit(24, 16, g)
    c = codes(20_000, 24, 0.06, g)
    tc = plt(arch)
    trainer = TranscoderTrainer(tc, cfg)
    log = trainer.train(batches(c @ d_in, c @ d_out), n_steps=800, progress=False)
    assert (recovered(tc.W_dec, d_out) > 0.9).float().mean() >= 0.9
    assert log[-1]["explained_variance"] > 0.85 and log[-1]["l0"] < 5
    assert (recovered(plt(arch).W_dec, d_out) > 0.9).float().mean() < 0.5  # an untrained one does not
    if arch == "jumprelu":
        assert bool((tc.threshold >= 0).all()) and float(tc.threshold.detach().mean()) > 0.5  # the thresholds learnt


def test_skip_transcoder_learns_the_sparse_part_and_uses_its_skip() -> None:
    """targets = sparse part + a linear map of the input; the input carries each feature with a random sign
    and the target its magnitude, so no linear map of the input predicts the sparse part: the features must;
    the input's dense noise passes through the linear map, which sparse features cannot copy: the skip must."""
    g = torch.Generator().manual_seed(0)
    d_in, d_out = unit(12, 16, g), unit(12, 16, g)
    c = codes(20_000, 12, 0.1, g)
    x = (c * (torch.randint(0, 2, c.shape, generator=g) * 2 - 1)) @ d_in
    x = x + 0.3 * torch.randn(x.shape, generator=g)  # a dense part, which only the skip can map
    m = torch.randn(16, 16, generator=g) * 0.3
    y = c @ d_out + x @ m.T
    cfg = TranscoderTrainingConfig(lr=3e-3, l1_coefficient=0.3)
    with_skip, without = plt("relu", skip=True), plt("relu")
    log = TranscoderTrainer(with_skip, cfg).train(batches(x, y), n_steps=800, progress=False)
    plain = TranscoderTrainer(without, TranscoderTrainingConfig(lr=3e-3, l1_coefficient=0.3))
    log_plain = plain.train(batches(x, y), n_steps=800, progress=False)
    assert (recovered(with_skip.W_dec, d_out) > 0.9).float().mean() >= 0.9
    assert float((with_skip.W_skip.detach() - m).norm() / m.norm()) < 0.15  # the skip is the planted map
    assert log[-1]["explained_variance"] > 0.9
    assert log[-1]["explained_variance"] > log_plain[-1]["explained_variance"] + 0.03


@pytest.mark.parametrize("arch", ["topk", "relu"])
def test_clt_recovers_features_that_write_into_later_layers(arch: str) -> None:
    """Layer 0's features write into layers 0 and 1 (a planted cross-layer decoder), layer 1's into layer 1:
    each learned feature's decoders, taken together, must match the planted pair."""
    g = torch.Generator().manual_seed(0)
    in0, in1, d00, d11 = unit(24, 16, g), unit(24, 16, g), unit(24, 16, g), unit(24, 16, g)
    d01 = unit(24, 16, g) * 0.7
    c0, c1 = codes(20_000, 24, 0.06, g), codes(20_000, 24, 0.06, g)
    xs = torch.stack([c0 @ in0, c1 @ in1])
    ys = torch.stack([c0 @ d00, c1 @ d11 + c0 @ d01])
    kw = {"k": 4} if arch == "topk" else {}
    clt = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=16, d_sae=48, d_out=16, architecture=arch, **kw))
    trainer = TranscoderTrainer(clt, TranscoderTrainingConfig(lr=3e-3, l1_coefficient=0.5))
    log = trainer.train(batches(xs, ys), n_steps=800, progress=False)
    assert (recovered(clt.W_dec[0], torch.stack([d00, d01], 1)) > 0.9).float().mean() >= 0.9
    assert (recovered(clt.W_dec[1], d11[:, None]) > 0.9).float().mean() >= 0.9
    assert log[-1]["explained_variance.0"] > 0.85 and log[-1]["explained_variance.1"] > 0.85
    if arch == "topk":  # the unit norm is over a feature's decoders together
        norms = clt.W_dec[0].detach().flatten(1).norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones(48), atol=1e-5, rtol=1e-5)


def test_a_set_of_plts_trains_each_layer_on_its_own_rows_in_one_step() -> None:
    g = torch.Generator().manual_seed(0)
    tcs = [plt("topk") for _ in range(2)]
    xs, ys = torch.randn(2, 64, 16, generator=g), torch.randn(2, 64, 16, generator=g)
    trainer = TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=1e-3))
    trainer.step((xs, ys))
    torch.testing.assert_close(tcs[0].b_dec.detach(), ys[0].mean(0), atol=1e-2, rtol=1e-2)  # each layer's own mean
    torch.testing.assert_close(tcs[1].b_dec.detach(), ys[1].mean(0), atol=1e-2, rtol=1e-2)
    # the loss is the sum of the layers' losses, each computed by hand from that layer's transcoder
    _, parts = trainer.losses(trainer._check_batch((xs, ys), 2))
    by_hand = sum(float((tcs[i](xs[i]) - ys[i]).pow(2).sum(-1).mean().detach()) for i in range(2))
    assert float(parts["mse"].detach()) == pytest.approx(by_hand, rel=1e-5)


# ----------------------------------------------------------------------------------------------
# JumpReLU: the estimators' gradients, written out from their definition
# ----------------------------------------------------------------------------------------------
def test_jumprelu_straight_through_gradients_equal_their_definition() -> None:
    pre = torch.tensor([[0.10, 0.48, 0.52, 0.9], [0.47, 0.2, 0.55, 0.53]], requires_grad=True)
    threshold = torch.tensor([0.5, 0.5, 0.5, 0.5], requires_grad=True)
    bw = 0.1
    out = _JumpGate.apply(pre, threshold, bw)
    torch.testing.assert_close(out.detach(), torch.tensor([[0, 0, 0.52, 0.9], [0, 0, 0.55, 0.53]]))
    out.sum().backward()
    assert pre.grad is not None and threshold.grad is not None
    assert pre.grad.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    # d/dthreshold: -threshold / bw where |pre - threshold| < bw / 2 (0.48, 0.52, 0.47, 0.53 are inside)
    inside = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.float32)
    torch.testing.assert_close(threshold.grad, -(0.5 / bw) * inside.sum(0))
    threshold.grad = None
    pre.grad = None
    count = _Heaviside.apply(pre, threshold, bw)
    assert count.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1]]
    count.sum().backward()
    assert pre.grad is None  # the L0 trains the threshold only (sae-lens' default, DeepMind's)
    torch.testing.assert_close(threshold.grad, -(1 / bw) * inside.sum(0))


def test_jumprelu_l0_loss_and_thresholds_after_a_step() -> None:
    tc = plt("jumprelu", d=4, d_sae=3)
    with torch.no_grad():
        tc.W_enc.copy_(torch.eye(4)[:, :3])
        tc.W_dec.copy_(torch.eye(3, 4))
        tc.threshold.fill_(0.3)
    cfg = TranscoderTrainingConfig(lr=1e-1, init_weights=False, l0_coefficient=2.0)
    trainer = TranscoderTrainer(tc, cfg)
    x = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.2, 2.0, 0.0, 0.0]])
    _, parts = trainer.losses(trainer._check_batch((x, x), 1))
    assert float(parts["l0_loss"].detach()) == pytest.approx(2.0 * (2 + 1) / 2)  # 2 and 1 features above 0.3
    with torch.no_grad():
        tc.threshold.fill_(-1.0)
    trainer.step((x, x))
    assert bool((tc.threshold >= 0).all())  # projected back after the step


# ----------------------------------------------------------------------------------------------
# NaN batches and dict batches
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["inputs", "targets"])
def test_a_nan_batch_is_refused_by_step_and_layer_before_it_touches_the_weights(where: str) -> None:
    g = torch.Generator().manual_seed(0)
    clt = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=16, d_sae=32, d_out=16, architecture="topk", k=4))
    trainer = TranscoderTrainer(clt, TranscoderTrainingConfig(lr=1e-3, log_every=1))
    good = [(torch.randn(2, 32, 16, generator=g), torch.randn(2, 32, 16, generator=g)) for _ in range(2)]
    trainer.train(iter(good), n_steps=2, progress=False)
    before = {k: v.detach().clone() for k, v in clt.state_dict().items()}
    xs, ys = torch.randn(2, 32, 16, generator=g), torch.randn(2, 32, 16, generator=g)
    (xs if where == "inputs" else ys)[1, 5, 3] = float("nan")
    with pytest.raises(
        NonFiniteTrainingError, match=rf"step 3 holds nan in the {where} of layer 1 at \[row 5, column 3\]"
    ) as e:
        trainer.step((xs, ys))
    assert e.value.step == 3 and e.value.last_good_step == 2
    for k, v in clt.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_dict_batches_from_the_activation_store_are_read_by_hook() -> None:
    model = from_pretrained("tiny-gpt2")
    tcs = [
        Transcoder(
            TranscoderConfig(
                d_in=128, d_sae=32, d_out=128, architecture="topk", k=4,
                metadata={"hook_name": f"blocks.{i}.ln2.hook_normalized", "hook_name_out": f"blocks.{i}.hook_mlp_out"},
            )
        )
        for i in range(2)
    ]  # fmt: skip
    trainer = TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=1e-3))
    assert trainer.hooks == [
        "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"
    ]  # fmt: skip
    from interp_gpt.store import ActivationStore

    store = ActivationStore(model, trainer.hooks, [CORPUS.read_text()[:4000]], context_size=32, out_batch_size=64)
    batch = store.next_batch()
    assert isinstance(batch, dict)
    xs, ys = trainer._check_batch(batch, 1)
    torch.testing.assert_close(xs[1], batch["blocks.1.ln2.hook_normalized"])
    torch.testing.assert_close(ys[0], batch["blocks.0.hook_mlp_out"])
    trainer.step(batch)
    store.close()


# ----------------------------------------------------------------------------------------------
# evaluate_transcoders against plain hooks
# ----------------------------------------------------------------------------------------------
def _tiny_set(model: Any, skip: bool) -> list[Transcoder]:
    tcs = []
    for i in range(model.cfg.n_layers):
        tc = Transcoder(
            TranscoderConfig(
                d_in=128, d_sae=32, d_out=128, architecture="relu", skip=skip,
                metadata={"hook_name": f"blocks.{i}.ln2.hook_normalized", "hook_name_out": f"blocks.{i}.hook_mlp_out"},
            )
        )  # fmt: skip
        tc.init_weights(seed=i)
        with torch.no_grad():
            tc.b_enc.fill_(0.05)
            if skip:
                tc.W_skip.normal_(0, 0.02, generator=torch.Generator().manual_seed(10 + i))
        tcs.append(tc)
    return tcs


def _loss(model: Any, tokens: torch.Tensor, hooks: list[Any]) -> float:
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)))


@pytest.mark.parametrize("skip", [False, True])
def test_evaluate_transcoders_equals_plain_hooks_for_plts_and_for_a_clt_with_only_own_layer_decoders(
    skip: bool,
) -> None:
    model = from_pretrained("tiny-gpt2")
    model.eval()
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 16), generator=torch.Generator().manual_seed(0))
    tcs = _tiny_set(model, skip)
    got = evaluate_transcoders(model, tcs, tokens, batch_size=2)
    with torch.no_grad():  # the reference: every MLP output replaced by plain hooks, from the run's own input
        seen: dict[int, torch.Tensor] = {}

        def read(i: int) -> Any:
            return lambda x, hook: seen.__setitem__(i, x)

        def write(i: int) -> Any:
            tc = tcs[i]

            def f(y: torch.Tensor, hook: Any) -> torch.Tensor:
                x = seen[i]
                out = torch.relu(x @ tc.W_enc + tc.b_enc) @ tc.W_dec + tc.b_dec
                return out + x @ tc.W_skip.T if skip else out

            return f

        hooks = [(f"blocks.{i}.ln2.hook_normalized", read(i)) for i in range(2)]
        hooks += [(f"blocks.{i}.hook_mlp_out", write(i)) for i in range(2)]
        spliced = _loss(model, tokens, hooks)
        zero = _loss(
            model, tokens, [(f"blocks.{i}.hook_mlp_out", lambda y, hook: torch.zeros_like(y)) for i in range(2)]
        )
        clean = _loss(model, tokens, [])
        _, cache = model.run_with_cache(tokens)
        ev = []
        for i, tc in enumerate(tcs):
            x, y = (
                cache[f"blocks.{i}.ln2.hook_normalized"].reshape(-1, 128),
                cache[f"blocks.{i}.hook_mlp_out"].reshape(-1, 128),
            )
            y_hat = torch.relu(x @ tc.W_enc + tc.b_enc) @ tc.W_dec + tc.b_dec + (x @ tc.W_skip.T if skip else 0)
            y_hat = y_hat - y_hat.mean(-1, keepdim=True)  # made for raw weights (no model_processing): spliced centred
            ev.append(float(1 - (y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum()))
    assert got["ce_spliced"] == pytest.approx(spliced, rel=1e-5)
    assert got["ce_zero_ablation"] == pytest.approx(zero, rel=1e-5)
    assert got["ce_clean"] == pytest.approx(clean, rel=1e-5)
    assert got["ce_loss_recovered"] == pytest.approx((zero - spliced) / (zero - clean), rel=1e-4)
    assert got["explained_variance_per_layer"] == pytest.approx(ev, rel=1e-4, abs=1e-5)
    assert got["layers"] == [0, 1] and got["n_tokens"] == 48
    # a CLT whose only decoders are each layer's own is this PLT set: the same numbers through its own path
    clt = CrossLayerTranscoder(
        CLTConfig(n_layers=2, d_in=128, d_sae=32, d_out=128, architecture="relu", skip=skip,
                  metadata={"hook_name": "ln2.hook_normalized", "hook_name_out": "hook_mlp_out"})
    )  # fmt: skip
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "b_dec") + (("W_skip",) if skip else ()):
            getattr(clt, name).copy_(torch.stack([getattr(tc, name) for tc in tcs]))
        clt.W_dec[0].zero_()
        clt.W_dec[0][:, 0] = tcs[0].W_dec
        clt.W_dec[1][:, 0] = tcs[1].W_dec
    got_clt = evaluate_transcoders(model, clt, tokens, batch_size=3)
    for key in ("ce_spliced", "explained_variance", "l0", "dead_fraction", "mse"):
        assert got_clt[key] == pytest.approx(got[key], rel=1e-5, abs=1e-6), key
    with torch.no_grad():  # and a cross-layer decoder changes what layer 1 receives
        clt.W_dec[0][:, 1] = tcs[0].W_dec
    assert evaluate_transcoders(model, clt, tokens)["ce_spliced"] != pytest.approx(got["ce_spliced"], rel=1e-4)


# ----------------------------------------------------------------------------------------------
# the command, end to end on tiny-gpt2
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "a.txt").write_text(CORPUS.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    return folder


def argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["--data", str(data), "--d-sae", "32", "--k", "4", "--batch-size", "128", "--n-tokens", "384",
            "--context-size", "32", "--val-windows", "2", "--no-progress", "--out", str(out), *extra]  # fmt: skip


FIELDS = (
    "explained_variance_per_layer", "l0_per_layer", "dead_fraction_per_layer", "explained_variance", "l0",
    "dead_fraction", "ce_clean", "ce_spliced", "ce_zero_ablation", "ce_loss_recovered", "n_tokens",
)  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("skip", []), ("plt", ["--format", "circuit-tracer", "--input-hook", "hook_resid_mid"]), ("clt", [])],
)
def test_train_transcoder_writes_a_set_that_loads_and_its_metrics(
    data_dir: Path, tmp_path: Path, kind: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from interp_gpt.cli import main as cli_main

    out = tmp_path / kind
    assert cli_main(["train-transcoder", *argv(data_dir, out, "--kind", kind, *extra)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and metrics["train_tokens"] == 384 and metrics["layers"] == [0, 1]
    assert metrics["kind"] == kind and set(FIELDS) <= set(metrics["validation"])
    assert metrics["validation"]["n_tokens"] == 2 * 32
    model = from_pretrained("tiny-gpt2")
    if kind == "clt":
        clt = load_clt(out)
        assert clt.n_layers == 2 and clt.cfg.k == 4
        assert clt.cfg.processing == {"fold_ln": True, "center_writing_weights": True}
        again = evaluate_transcoders(model, clt, _val_tokens(model, data_dir))
    else:
        tcs = load_transcoders(out, model)
        assert [tc.layer for tc in tcs] == [0, 1] and tcs[0].cfg.skip == (kind == "skip")
        hook = "hook_resid_mid" if "hook_resid_mid" in extra else "ln2.hook_normalized"
        assert tcs[1].input_hook == f"blocks.1.{hook}" and tcs[1].output_hook == "blocks.1.hook_mlp_out"
        # trained on from_pretrained's processed weights, and recorded so (else taken for raw weights)
        assert all(tc.cfg.processing == {"fold_ln": True, "center_writing_weights": True} for tc in tcs)
        again = evaluate_transcoders(model, tcs, _val_tokens(model, data_dir))
    # the metrics recomputed from the saved files equal the ones written
    for key in ("ce_loss_recovered", "explained_variance", "l0", "dead_fraction"):
        assert again[key] == pytest.approx(metrics["validation"][key], rel=1e-5, abs=1e-6), key
    # a second run into the same folder replaces the set
    capsys.readouterr()
    assert cli_main(["train-transcoder", *argv(data_dir, out, "--kind", kind, "--seed", "1", *extra)]) == 0


def _val_tokens(model: Any, data: Path) -> torch.Tensor:
    from interp_gpt.sae.training import split_corpus, token_windows

    return token_windows(model, split_corpus(data)[1], 32, 2)


def test_python_m_runs_the_same_command(data_dir: Path, tmp_path: Path) -> None:
    from interp_gpt.sae.train_transcoder_command import main

    assert main(argv(data_dir, tmp_path / "t", "--layers", "1", "--architecture", "relu")) == 0
    tcs = load_transcoders(tmp_path / "t")
    assert [tc.layer for tc in tcs] == [1] and tcs[0].cfg.architecture == "relu"
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert metrics["command"].startswith("python -m interp_gpt.sae.train_transcoder_command --data")
    assert metrics["validation"]["layers"] == [1]


def test_the_reconstruction_loss_trains_the_thresholds_through_the_gate() -> None:
    """d mse / d threshold_i = sum over rows of (d mse / d f_i) x (-threshold_i / bandwidth) where the
    pre-activation is within bandwidth / 2 of the threshold (the gate's estimator), written out by hand."""
    tc = plt("jumprelu", d=3, d_sae=3)
    with torch.no_grad():
        tc.W_enc.copy_(torch.eye(3))
        tc.W_dec.copy_(torch.eye(3))
        tc.b_enc.zero_()
        tc.b_dec.zero_()
        tc.threshold.fill_(0.5)
    cfg = TranscoderTrainingConfig(init_weights=False, l0_coefficient=0.0, jumprelu_bandwidth=0.1)
    trainer = TranscoderTrainer(tc, cfg)
    x = torch.tensor([[0.52, 0.9, 0.2], [0.47, 0.53, 0.0]])
    y = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    loss, _ = trainer.losses(trainer._check_batch((x, y), 1))
    loss.backward()
    y_hat = x * (x > 0.5)
    d_f = 2 * (y_hat - y) / 2  # d mean_rows sum_d (y_hat - y)^2 / d f  (W_dec = I)
    inside = ((x - 0.5).abs() < 0.05).float()
    assert tc.threshold.grad is not None
    torch.testing.assert_close(tc.threshold.grad, (d_f * -(0.5 / 0.1) * inside).sum(0))


def test_topk_aux_loss_equals_a_hand_computation_on_the_dead_features_of_each_clt_layer() -> None:
    g = torch.Generator().manual_seed(0)
    clt = CrossLayerTranscoder(CLTConfig(n_layers=2, d_in=6, d_sae=12, d_out=6, architecture="topk", k=2))
    cfg = TranscoderTrainingConfig(lr=1e-3, dead_feature_window=1, aux_coefficient=0.5)
    trainer = TranscoderTrainer(clt, cfg)
    trainer.step((torch.randn(2, 3, 6, generator=g), torch.randn(2, 3, 6, generator=g)))
    dead = trainer.steps_since_fired >= 1
    assert dead.any(1).all()  # with k=2 of 12 some features of each layer stayed silent
    xs, ys = torch.randn(2, 16, 6, generator=g), torch.randn(2, 16, 6, generator=g)
    _, parts = trainer.losses(trainer._check_batch((xs, ys), 2))
    with torch.no_grad():  # by hand, densely: layer s's dead features predict the residual of layers s..1
        y_hat = clt.decode(clt.encode(xs))
        total = 0.0
        for s in range(2):
            pre = xs[s] @ clt.W_enc[s] + clt.b_enc[s]
            n_dead, k_aux = int(dead[s].sum()), 3  # d_out // 2
            kept = torch.where(dead[s], pre, -torch.inf).topk(min(k_aux, n_dead), dim=-1)
            acts = torch.zeros_like(pre).scatter(-1, kept.indices, kept.values)
            aux_hat = acts @ clt.W_dec[s].flatten(1)
            residual = (ys[s:] - y_hat[s:]).permute(1, 0, 2).flatten(1)
            total += 0.5 * min(n_dead / k_aux, 1.0) * float((aux_hat - residual).pow(2).sum(-1).mean())
    assert float(parts["aux"].detach()) == pytest.approx(total, rel=1e-5)


def test_the_log_reports_the_evaluation_on_eval_tokens_every_eval_every_steps() -> None:
    model = from_pretrained("tiny-gpt2")
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    tcs = _tiny_set(model, skip=True)
    trainer = TranscoderTrainer(tcs, TranscoderTrainingConfig(lr=1e-3, log_every=1, eval_every=2), model, tokens)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(2, 16, 128, generator=g), torch.randn(2, 16, 128, generator=g)) for _ in range(3)]
    log = trainer.train(iter(data), n_steps=3, progress=False)
    assert "val_ce_loss_recovered" not in log[0] and "val_ce_loss_recovered" in log[1] and "val_l0" in log[2]
    assert log[2]["val_ce_spliced"] == pytest.approx(evaluate_transcoders(model, tcs, tokens)["ce_spliced"], rel=1e-6)


def test_activation_batches_of_several_hooks_keep_rows_aligned_after_the_first_pass() -> None:
    """Later passes reshuffle the kept rows: each hook's row i must still come from the same token
    (ln2.hook_normalized is hook_resid_mid standardised, row by row)."""
    from interp_gpt.sae.training import activation_batches

    model = from_pretrained("tiny-gpt2")
    hooks = ["blocks.1.hook_resid_mid", "blocks.1.ln2.hook_normalized"]
    it = activation_batches(model, hooks, [CORPUS.read_text()[:3000]], batch_size=64, context_size=16)
    for _ in range(30):  # ~ 750 tokens make 11 batches a pass: this crosses two passes
        batch = next(it)
        mid, norm = batch[hooks[0]].double(), batch[hooks[1]].double()
        centred = mid - mid.mean(-1, keepdim=True)
        expected = centred / (centred.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
        torch.testing.assert_close(norm, expected, atol=2e-2, rtol=1e-2)
