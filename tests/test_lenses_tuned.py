"""The tuned lens (interp_gpt.lenses): the identity lens is the logit lens, training lowers the held-out
KL at every layer and equals a from-scratch loop of tuned-lens' objective, files round-trip, a stopped
run resumes to the same weights, and bad inputs are refused by name."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from interp_gpt import GPT
from interp_gpt.inspect import logit_lens
from interp_gpt.lenses import PROCESSING_KEY, TunedLens, fit_tuned_lens, lens_kl, lens_windows
from interp_gpt.sae.data import split_corpus

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "corpus"
PROMPT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def texts() -> tuple[list[str], list[str]]:
    return split_corpus(CORPUS)


def _perturbed(model: GPT) -> TunedLens:
    """A lens with small random translators (as if trained)."""
    torch.manual_seed(0)
    lens = TunedLens.from_model(model)
    with torch.no_grad():
        for t in lens:
            assert isinstance(t, nn.Linear)
            t.weight.normal_(std=0.02)
            t.bias.normal_(std=0.1)
    return lens


# ----- the identity lens ---------------------------------------------------------------------
def test_the_identity_lens_is_the_logit_lens_and_the_models_readout(model: GPT) -> None:
    logits, cache = model.run_with_cache(PROMPT)
    reference, labels = logit_lens(cache)  # [n_layers + 1, pos, d_vocab]
    lens = TunedLens.from_model(model)
    ours = lens.forward_all(cache)  # [n_layers, batch, pos, d_vocab]
    assert ours.shape == (model.cfg.n_layers, 1, *reference.shape[1:])
    torch.testing.assert_close(ours[:, 0], reference[:-1], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lens.forward_all(model.to_tokens(PROMPT)), ours)  # tokens: one pass of its own
    torch.testing.assert_close(
        lens.unembed(cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]), logits, atol=2e-5, rtol=2e-5
    )
    h = cache["blocks.1.hook_resid_pre"][0, 3]  # any leading shape
    torch.testing.assert_close(lens(h, 1), reference[1, 3], atol=2e-5, rtol=2e-5)


def test_a_translator_changes_exactly_its_own_layer(model: GPT) -> None:
    _, cache = model.run_with_cache(PROMPT)
    lens = TunedLens.from_model(model)
    before = lens.forward_all(cache)
    with torch.no_grad():
        lens[1].bias.add_(torch.randn(model.cfg.d_model))
    after = lens.forward_all(cache)
    assert torch.equal(after[0], before[0]) and not torch.allclose(after[1], before[1])
    h = cache["blocks.1.hook_resid_pre"]
    torch.testing.assert_close(lens.transform_hidden(h, 1), h + lens[1].bias)


# ----- training --------------------------------------------------------------------------------
def test_training_lowers_the_held_out_kl_below_the_logit_lens_at_every_layer(model: GPT, texts) -> None:  # type: ignore[no-untyped-def]
    train, val = texts
    lens = fit_tuned_lens(model, train, steps=40, batch_size=8, context_size=64, progress=False)
    logit = lens_kl(TunedLens.from_model(model), val, context_size=64, max_windows=32)
    tuned = lens_kl(lens, val, context_size=64, max_windows=32)
    assert tuned.shape == (model.cfg.n_layers,)
    assert bool((tuned < 0.8 * logit).all()), (logit, tuned)


def _reference_fit(model: GPT, windows: torch.Tensor, steps: int, batch_size: int, seed: int) -> list[nn.Linear]:
    """tuned-lens 0.2's training loop, written again from its definition with the model's own modules."""
    d, n_layers = model.cfg.d_model, model.cfg.n_layers
    translators = [nn.Linear(d, d) for _ in range(n_layers)]
    for t in translators:
        nn.init.zeros_(t.weight)
        nn.init.zeros_(t.bias)
    params = [p for t in translators for p in t.parameters()]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (steps - s) / steps)
    per_epoch = windows.shape[0] // batch_size
    seen: dict[int, torch.Tensor] = {}  # each layer's input, from the step's forward
    hooks = [
        (f"blocks.{L}.hook_resid_pre", lambda x, hook, L=L: seen.__setitem__(L, x.detach().clone()))
        for L in range(n_layers)
    ]
    model.requires_grad_(False)
    try:
        for step in range(steps):
            order = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(seed + step // per_epoch))
            i = step % per_epoch
            batch = windows[order[i * batch_size : (i + 1) * batch_size]]
            with torch.no_grad():
                target = model.run_with_hooks(batch, fwd_hooks=hooks).log_softmax(-1)
            for L in range(n_layers):
                h = seen[L]
                out = model.unembed(model.ln_final(h + translators[L](h))).log_softmax(-1)
                (target.exp() * (target - out)).sum(-1).mean().backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad()
            sched.step()
    finally:
        model.requires_grad_(True)
    return translators


def test_training_equals_a_from_scratch_loop_of_the_same_objective(model: GPT) -> None:
    windows = lens_windows(model, [PROMPT * 20], context_size=16)
    assert windows.shape[0] >= 6
    lens = fit_tuned_lens(model, windows, steps=5, batch_size=2, seed=3, progress=False)
    reference = _reference_fit(model, windows, steps=5, batch_size=2, seed=3)
    for ours, ref in zip(lens, reference, strict=True):
        assert isinstance(ours, nn.Linear)
        assert ref.weight.abs().max() > 1e-4  # it moved
        torch.testing.assert_close(ours.weight, ref.weight, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours.bias, ref.bias, atol=1e-6, rtol=1e-6)


def test_training_works_under_a_callers_no_grad(model: GPT) -> None:
    """Notebooks switch gradients off globally; the lens must still train, to the same weights."""
    windows = lens_windows(model, [PROMPT * 20], context_size=16)
    loud = fit_tuned_lens(model, windows, steps=2, batch_size=2, seed=3, progress=False)
    with torch.no_grad():
        quiet = fit_tuned_lens(model, windows, steps=2, batch_size=2, seed=3, progress=False)
    for a, b in zip(loud, quiet, strict=True):
        assert isinstance(a, nn.Linear) and isinstance(b, nn.Linear)
        assert a.weight.abs().max() > 0
        torch.testing.assert_close(a.weight, b.weight, atol=0, rtol=0)


def test_a_stopped_run_is_saved_and_resumes_to_the_same_weights(model: GPT, tmp_path: Path) -> None:
    windows = lens_windows(model, [PROMPT * 20], context_size=16)
    whole = fit_tuned_lens(model, windows, steps=6, batch_size=2, progress=False)
    calls = {"n": 0}

    def stop_at_the_fourth_pass(x: torch.Tensor, hook: object) -> None:
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt

    model.blocks[0].hook_resid_pre.add_hook(stop_at_the_fourth_pass)
    try:
        with pytest.raises(KeyboardInterrupt):
            fit_tuned_lens(model, windows, steps=6, batch_size=2, progress=False, save_to=tmp_path / "lens")
    finally:
        model.reset_hooks()
    state = torch.load(tmp_path / "lens" / "training_state.pt", weights_only=True)
    assert state["step"] == 3
    resumed = fit_tuned_lens(
        model, windows, steps=6, batch_size=2, progress=False, save_to=tmp_path / "lens", resume=True
    )
    for a, b in zip(resumed.state_dict().values(), whole.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-7)
    with pytest.raises(ValueError, match=r"other settings .*'steps': \(6, 7\)"):
        fit_tuned_lens(model, windows, steps=7, batch_size=2, progress=False, save_to=tmp_path / "lens", resume=True)


# ----- files -----------------------------------------------------------------------------------
def test_save_and_load_round_trip_in_tuned_lens_format(model: GPT, tmp_path: Path) -> None:
    lens = _perturbed(model)
    folder = lens.save(tmp_path / "lens")
    config = json.loads((folder / "config.json").read_text())
    assert {
        "d_model": 128,
        "num_hidden_layers": 2,
        "bias": True,
        "lens_type": "linear_tuned_lens",
    }.items() <= config.items()
    assert config[PROCESSING_KEY] == {"fold_ln": True, "center_writing_weights": True, "center_unembed": True}
    assert len(config["unembed_hash"]) == 64
    params = torch.load(folder / "params.pt", weights_only=True)
    assert sorted(params) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    back = TunedLens.from_pretrained(folder, model)
    for a, b in zip(back.state_dict().values(), lens.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert back.config == lens.config
    h = torch.randn(2, 3, model.cfg.d_model)
    assert torch.equal(back(h, 0), lens(h, 0))


def test_a_lens_is_exact_across_fold_ln_and_refused_across_centring(tmp_path: Path) -> None:
    raw = GPT.from_pretrained_no_processing("tiny-gpt2")
    folded = GPT.from_pretrained("tiny-gpt2", fold_ln=True, center_writing_weights=False, center_unembed=True)
    lens = _perturbed(raw)
    lens.save(tmp_path / "raw")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # another W_U, but processed otherwise: no hash warning
        on_folded = TunedLens.from_pretrained(tmp_path / "raw", folded)
        TunedLens.from_pretrained(
            tmp_path / "raw", GPT.from_pretrained("tiny-gpt2", fold_ln=False, center_writing_weights=False)
        )  # center_unembed alone
    tokens = raw.to_tokens(PROMPT)
    torch.testing.assert_close(
        on_folded.forward_all(tokens).log_softmax(-1), lens.forward_all(tokens).log_softmax(-1), atol=1e-4, rtol=1e-4
    )
    with pytest.raises(
        ValueError, match=r"trained on a raw residual stream .* model's is centred .*from_pretrained_no_processing"
    ):
        TunedLens.from_pretrained(tmp_path / "raw", GPT.from_pretrained("tiny-gpt2"))
    _perturbed(GPT.from_pretrained("tiny-gpt2")).save(tmp_path / "processed")
    with pytest.raises(ValueError, match=r"trained on a centred residual stream .* model's is raw"):
        TunedLens.from_pretrained(tmp_path / "processed", raw)


def test_another_unembedding_on_the_same_processing_warns(model: GPT, tmp_path: Path) -> None:
    _perturbed(model).save(tmp_path / "lens")
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    config["unembed_hash"] = "0" * 64
    (tmp_path / "lens" / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="unembed_hash 000000000000... differs"):
        TunedLens.from_pretrained(tmp_path / "lens", model)


# ----- bad inputs ------------------------------------------------------------------------------
def _other(**kw: int) -> GPT:
    cfg = GPT.from_pretrained("tiny-gpt2").cfg
    return GPT(type(cfg)(**{**cfg.__dict__, **kw}))


def test_a_lens_for_another_shape_is_refused_naming_both(model: GPT, tmp_path: Path) -> None:
    TunedLens.from_model(_other(d_model=64, d_head=16)).save(tmp_path / "narrow")
    with pytest.raises(ValueError, match=r"d_model=64 but the model 'tiny-gpt2' has d_model=128"):
        TunedLens.from_pretrained(tmp_path / "narrow", model)
    TunedLens.from_model(_other(n_layers=3)).save(tmp_path / "deep")
    with pytest.raises(ValueError, match=r"num_hidden_layers=3 but the model 'tiny-gpt2' has num_hidden_layers=2"):
        TunedLens.from_pretrained(tmp_path / "deep", model)


def test_bad_files_are_refused_by_name(model: GPT, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing \['config.json', 'params.pt'\]"):
        TunedLens.from_pretrained(tmp_path / "nowhere", model)
    folder = TunedLens.from_model(model).save(tmp_path / "lens")
    params = torch.load(folder / "params.pt", weights_only=True)
    torch.save({**params, "2.weight": params["0.weight"]}, folder / "params.pt")
    with pytest.raises(ValueError, match=r"unexpected \['2.weight'\]"):
        TunedLens.from_pretrained(folder, model)
    torch.save({k: v for k, v in params.items() if k != "1.bias"}, folder / "params.pt")
    with pytest.raises(ValueError, match=r"missing \['1.bias'\]"):
        TunedLens.from_pretrained(folder, model)
    torch.save({**params, "0.bias": torch.full((128,), float("nan"))}, folder / "params.pt")
    with pytest.raises(ValueError, match=r"\['0.bias'\] hold NaN or inf"):
        TunedLens.from_pretrained(folder, model)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        TunedLens.from_pretrained(folder, model)


def test_bad_calls_are_refused_by_name(model: GPT) -> None:
    lens = TunedLens.from_model(model)
    h = torch.randn(1, 4, 128)
    with pytest.raises(ValueError, match=r"layer=2 is out of range: layers are 0..1"):
        lens(h, 2)
    with pytest.raises(TypeError, match=r"TunedLens: layer must be an int, got str"):
        lens(h, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"h has shape \(1, 4, 64\) .* expected a float tensor \[..., d_model=128\]"):
        lens(torch.randn(1, 4, 64), 0)
    with pytest.raises(TypeError, match="model_or_lens must be a GPT or a TunedLens, got str"):
        fit_tuned_lens("tiny-gpt2", "data/corpus", steps=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model must be an interp_gpt GPT"):
        TunedLens("tiny-gpt2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"data: 1 windows of 16 tokens, fewer than batch_size=2"):
        fit_tuned_lens(model, torch.zeros(1, 16, dtype=torch.long), steps=1, batch_size=2, progress=False)
    with pytest.raises(ValueError, match=r"steps=0 is out of range"):
        fit_tuned_lens(model, torch.zeros(4, 16, dtype=torch.long), steps=0, progress=False)
    with pytest.raises(ValueError, match=r"resume=True needs save_to"):
        fit_tuned_lens(model, torch.zeros(4, 16, dtype=torch.long), steps=1, batch_size=2, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"token tensor of shape \(4, 200\)"):
        lens_windows(model, torch.zeros(4, 200, dtype=torch.long))
