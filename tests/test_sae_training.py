"""SAETrainer: it recovers planted sparse directions, keeps the decoder unit-norm, counts dead features,
and its metrics equal an independent computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interp_gpt import GPT
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.training import SAETrainer, SAETrainingConfig, evaluate_sae, explained_variance, split_corpus

HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(autouse=True)
def one_thread():  # type: ignore[no-untyped-def]
    """Small matrices: one thread is faster, and much faster on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def planted(
    n: int, d_in: int = 16, n_true: int = 24, p: float = 0.06, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that are sparse non-negative mixtures of `n_true` unit directions (returned too)."""
    g = torch.Generator().manual_seed(seed)
    dirs = F.normalize(torch.randn(n_true, d_in, generator=g), dim=-1)
    on = torch.rand(n, n_true, generator=g) < p
    coeff = on * (1 + torch.rand(n, n_true, generator=g))
    return coeff @ dirs, dirs


def batches(x: torch.Tensor, size: int, seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - size + 1, size):
            yield x[order[i : i + size]]


def toy_sae(arch: str, d_in: int = 16, d_sae: int = 48, **kw: object) -> SAE:
    return SAE(SAEConfig(d_in=d_in, d_sae=d_sae, architecture=arch, metadata={"hook_name": HOOK}, **kw))  # type: ignore[arg-type]


def recovered(sae: SAE, dirs: torch.Tensor) -> torch.Tensor:
    """For each planted direction, its best cosine similarity with a decoder row."""
    return (F.normalize(sae.W_dec.detach(), dim=-1) @ dirs.T).max(0).values


@pytest.mark.parametrize(
    ("arch", "kw", "cfg"),
    [
        ("topk", {"k": 4}, SAETrainingConfig(lr=3e-3, log_every=100)),
        ("standard", {}, SAETrainingConfig(lr=3e-3, l1_coefficient=0.5, log_every=100)),
    ],
)
def test_trainer_recovers_planted_sparse_directions(arch: str, kw: dict[str, int], cfg: SAETrainingConfig) -> None:
    torch.manual_seed(0)
    x, dirs = planted(20_000)
    sae = toy_sae(arch, **kw)  # type: ignore[arg-type]
    trainer = SAETrainer(sae, cfg)
    data = batches(x, 256)
    first = float(trainer.step(next(data))["loss"])  # the loss at initialisation
    log = trainer.train(data, n_steps=800, progress=False)
    assert log[-1]["loss"] < 0.5 * first
    assert log[-1]["explained_variance"] > 0.9
    assert log[-1]["l0"] <= 6
    cos = recovered(sae, dirs)
    assert (cos > 0.9).float().mean() >= 0.9, cos
    # a random decoder of the same size does not: the test can fail
    assert (recovered(toy_sae(arch, **kw), dirs) > 0.9).float().mean() < 0.5  # type: ignore[arg-type]


def test_topk_decoder_rows_stay_unit_norm_and_standard_ones_are_free() -> None:
    x, _ = planted(4096)
    sae = toy_sae("topk", k=4)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-2))
    trainer.train(batches(x, 256), n_steps=20, progress=False)
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(48), atol=1e-5, rtol=1e-5)
    std = toy_sae("standard")
    SAETrainer(std, SAETrainingConfig(lr=1e-2, l1_coefficient=0.1)).train(batches(x, 256), n_steps=20, progress=False)
    assert (std.W_dec.norm(dim=-1) - 1).abs().max() > 1e-3


def test_dead_feature_accounting_counts_batches_since_each_feature_fired() -> None:
    sae = toy_sae("standard", d_in=3, d_sae=3)
    with torch.no_grad():  # feature i fires exactly when coordinate i of the input is positive
        sae.W_enc.copy_(torch.eye(3))
        sae.W_dec.copy_(torch.eye(3))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-12, init_weights=False, dead_feature_window=3))
    fires = [[0], [0, 1], [0], [0], [0]]  # feature 2 never fires; feature 1 last fires at batch 2
    for active in fires:
        x = -torch.ones(4, 3)
        x[:, active] = 1.0
        trainer.step(x)
    assert trainer.steps_since_fired.tolist() == [0, 3, 5]
    assert trainer.dead_fraction == pytest.approx(2 / 3)  # 3 and 5 batches silent, window 3
    trainer.cfg.dead_feature_window = 4
    assert trainer.dead_fraction == pytest.approx(1 / 3)


def test_topk_aux_loss_is_zero_without_dead_features_and_trains_dead_ones() -> None:
    x, _ = planted(2048)
    sae = toy_sae("topk", k=2)
    trainer = SAETrainer(sae, SAETrainingConfig(lr=1e-3, dead_feature_window=1))
    parts = trainer.step(x[:256])
    assert "aux" not in parts or float(parts["aux"]) == 0.0
    dead = trainer.steps_since_fired >= 1
    assert dead.any()  # with k=2 of 48 some features stay silent on a batch
    before = sae.W_dec.detach().clone()
    _, parts = trainer.losses(x[256:512])
    assert float(parts["aux"].detach()) > 0
    sae.W_dec.grad = None
    parts["aux"].backward()
    assert sae.W_dec.grad is not None and sae.W_dec.grad[dead].abs().sum() > 0
    assert torch.equal(before, sae.W_dec.detach())


def test_explained_variance_matches_its_definition() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100, 8, generator=g) * 3 + 1
    x_hat = x + 0.5 * torch.randn(100, 8, generator=g)
    xs, xh = x.numpy().astype("float64"), x_hat.numpy().astype("float64")
    want = 1 - ((xs - xh) ** 2).sum() / ((xs - xs.mean(0)) ** 2).sum()
    assert explained_variance(x, x_hat) == pytest.approx(want, rel=1e-9)
    assert explained_variance(x, x) == 1.0


def test_evaluate_sae_equals_an_independent_computation(tiny_model: GPT) -> None:
    tiny_model.eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, tiny_model.cfg.d_vocab, (6, 12), generator=g)
    sae = toy_sae("topk", d_in=tiny_model.cfg.d_model, d_sae=96, k=8)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    got = evaluate_sae(tiny_model, sae, tokens, batch_size=4)  # two uneven batches

    def run(replace=None):  # type: ignore[no-untyped-def]
        hooks = [] if replace is None else [(HOOK, lambda a, hook: replace(a))]
        return tiny_model.run_with_hooks(tokens, fwd_hooks=hooks)

    def ce(replace=None):  # type: ignore[no-untyped-def]
        logits = run(replace)
        return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)))

    def by_hand(a: torch.Tensor) -> torch.Tensor:  # the SAE's maths, written out
        pre = (a - sae.b_dec) @ sae.W_enc + sae.b_enc
        top = pre.topk(8, dim=-1)
        f = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        return f @ sae.W_dec + sae.b_dec

    with torch.no_grad():
        clean, spliced, zero = ce(), ce(by_hand), ce(torch.zeros_like)
        _, cache = tiny_model.run_with_cache(tokens)
        a = cache[HOOK].reshape(-1, sae.cfg.d_in).double()
        a_hat = by_hand(cache[HOOK]).reshape(-1, sae.cfg.d_in).double()
        pre = (cache[HOOK] - sae.b_dec) @ sae.W_enc + sae.b_enc
        kth = pre.topk(8, dim=-1).values.relu()
        top_idx = pre.topk(8, dim=-1).indices.reshape(-1, 8)
        p_clean = torch.softmax(run().double(), -1)
        p_spliced = torch.softmax(run(by_hand).double(), -1)
    kl = float((p_clean * (p_clean.log() - p_spliced.log())).sum(-1).mean())
    assert got["kl_div"] == pytest.approx(kl, rel=1e-4) and got["kl_div"] > 0
    share = torch.bincount(top_idx.flatten(), minlength=96).double() / top_idx.shape[0]  # each fires once per row
    assert got["dense_fraction"] == pytest.approx(float((share > 0.1).double().mean()))
    assert got["dead_fraction"] == pytest.approx(float((share == 0).double().mean()))
    assert got["ce_clean"] == pytest.approx(clean, rel=1e-5)
    assert got["ce_spliced"] == pytest.approx(spliced, rel=1e-5)
    assert got["ce_zero_ablation"] == pytest.approx(zero, rel=1e-5)
    # (the CE values agree to float32 rounding; on a random model zero - clean is small, so the ratio is
    # checked on the returned losses, each checked above)
    want = (got["ce_zero_ablation"] - got["ce_spliced"]) / (got["ce_zero_ablation"] - got["ce_clean"])
    assert got["ce_loss_recovered"] == pytest.approx(want, rel=1e-12)
    assert got["ce_loss_recovered"] == pytest.approx((zero - spliced) / (zero - clean), abs=2e-3)
    ev = 1 - ((a - a_hat) ** 2).sum() / ((a - a.mean(0)) ** 2).sum()
    assert got["explained_variance"] == pytest.approx(float(ev), rel=1e-5)
    assert got["mse"] == pytest.approx(float(((a - a_hat) ** 2).sum(-1).mean()), rel=1e-5)
    assert got["l0"] == pytest.approx(float((kth > 0).sum(-1).float().mean()))
    assert got["n_tokens"] == tokens.numel()


def test_split_corpus_cuts_each_file_at_a_newline_near_the_tail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.txt").write_text("\ufeffline one\r\nline two\r\nline three\r\nend\r\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("x" * 50 + "\n" + "y" * 50 + "\n", encoding="utf-8")
    train, val = split_corpus(tmp_path, val_frac=0.3)
    assert [t + v for t, v in zip(train, val, strict=True)] == [
        "line one\nline two\nline three\nend\n",
        "x" * 50 + "\n" + "y" * 50 + "\n",
    ]
    assert val == ["end\n", ""] or val[0].startswith(("line three", "end"))
    assert all(t.endswith("\n") for t in train)
    with pytest.raises(FileNotFoundError, match="data_dir"):
        split_corpus(tmp_path / "nope")


def test_bad_trainer_input_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="jumprelu_sparsity_loss_mode='quadratic' needs target_l0"):
        SAETrainer(toy_sae("jumprelu"), SAETrainingConfig(jumprelu_sparsity_loss_mode="quadratic"))
    with pytest.raises(TypeError, match="sae"):
        SAETrainer("not an sae")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SAETrainingConfig: lr=-1\.0 is out of range"):
        SAETrainer(toy_sae("standard"), SAETrainingConfig(lr=-1.0))
    with pytest.raises(ValueError, match="n_steps"):
        SAETrainer(toy_sae("standard")).train(iter([]), n_steps=0)
    with pytest.raises(ValueError, match="ran out"):
        SAETrainer(toy_sae("standard")).train(iter([torch.randn(4, 16)]), n_steps=3, progress=False)


def test_train_sae_command_writes_a_loadable_sae_and_its_metrics(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json
    from pathlib import Path

    from interp_gpt.cli import main as cli_main
    from interp_gpt.sae.training import main

    corpus = Path(__file__).resolve().parent.parent / "data" / "corpus" / "tinyshakespeare_input.txt"
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text(corpus.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    argv = ["--data", str(data), "--d-sae", "64", "--k", "4", "--batch-size", "512", "--n-tokens", "2048",
            "--val-windows", "4", "--no-progress", "--out", str(tmp_path / "sae")]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "sae" / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["train_tokens"] == 2048
    assert metrics["command"].startswith("python -m interp_gpt.sae.training --data")
    assert metrics["validation"]["l0"] <= 4 and metrics["validation"]["n_tokens"] == 4 * 128
    sae = SAE.from_pretrained(tmp_path / "sae")
    assert sae.cfg.k == 4 and sae.cfg.hook_name == HOOK
    capsys.readouterr()
    assert cli_main(["train-sae", *argv[:-1], str(tmp_path / "sae2")]) == 0
    assert (tmp_path / "sae2" / "cfg.json").is_file()
    assert main([*argv[:-1], str(tmp_path / "sae3"), "--hook", "blocks.1.hook_resid_pr"]) == 2
    assert "did you mean" in capsys.readouterr().err
