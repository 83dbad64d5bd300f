"""utils.test_prompt / lm_accuracy and the evals module against transformer-lens' own, on one random
GPT-2 with GPT-2's vocabulary (transformer-lens 3.9's HookedTransformer in the 3.9 venv, 4.x's
TransformerBridge in the other: see tests/tl_gpt2.py). Where transformer-lens' helper takes a model,
it is also run on ours and must print / return what it does on its own model."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tl_gpt2  # noqa: E402

from interp_gpt import GPT, evals, utils  # noqa: E402
from interp_gpt.inspect import planted_heads_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tl_gpt2.hf_gpt2()


@pytest.fixture(scope="module")
def model(hf, gpt2_vocab_dir):  # type: ignore[no-untyped-def]
    return tl_gpt2.ours(hf, gpt2_vocab_dir)


@pytest.fixture(scope="module")
def ref(hf, gpt2_vocab_dir):  # type: ignore[no-untyped-def]
    return tl_gpt2.reference(hf, gpt2_vocab_dir)


@pytest.fixture(scope="module")
def plain_tok(gpt2_vocab_dir):  # type: ignore[no-untyped-def]
    """A Hugging Face GPT-2 tokenizer that adds no BOS (Hugging Face's default)."""
    return tl_gpt2.hf_tokenizer(gpt2_vocab_dir, add_bos_token=False)


def _tl(module: str):  # type: ignore[no-untyped-def]
    return pytest.importorskip(f"transformer_lens.{module}")


# ----------------------------------------------------------------------------
# test_prompt
# ----------------------------------------------------------------------------
PROMPT_CASES = [
    ("The cat sat on the", "mat", {}),
    ("The cat sat on the", " mat and the dog", {}),  # several answer tokens, a space already there
    ("Hello there my", ["friend", "dear", "good old"], {}),  # several answers: first tokens only
    ("One two three", "four", {"prepend_space_to_answer": False, "top_k": 3}),
    ("One two three", "four", {"prepend_bos": False, "top_k": 0}),
    ("One two three", ["four", "five"], {"print_details": False}),
]


@pytest.mark.parametrize("prompt, answer, kwargs", PROMPT_CASES)
def test_test_prompt_prints_what_transformer_lens_prints(model, ref, capsys, prompt, answer, kwargs):
    tl_test_prompt = _tl("utilities").test_prompt
    tl_test_prompt(prompt, answer, ref, **kwargs)
    theirs = capsys.readouterr().out
    utils.test_prompt(prompt, answer, model, **kwargs)
    ours = capsys.readouterr().out
    assert "Ranks of the answer tokens:" in theirs
    assert ours == theirs


@pytest.mark.parametrize("prompt, answer, kwargs", PROMPT_CASES[:3])
def test_transformer_lens_test_prompt_runs_on_our_model_and_prints_the_same(model, ref, capsys, prompt, answer, kwargs):
    tl_test_prompt = _tl("utilities").test_prompt
    tl_test_prompt(prompt, answer, ref, **kwargs)
    on_theirs = capsys.readouterr().out
    tl_test_prompt(prompt, answer, model, **kwargs)
    assert capsys.readouterr().out == on_theirs


def test_test_prompt_without_rich_prints_the_same_text_plainly(model, ref, capsys, monkeypatch):
    """Without `rich`, the bold markers go and nothing is wrapped; short lines read as transformer-lens'."""
    _tl("utilities").test_prompt("The cat sat on the", "mat", ref, top_k=3)
    theirs = capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "rich", None)  # `from rich import print` now raises ImportError
    utils.test_prompt("The cat sat on the", "mat", model, top_k=3)
    ours = capsys.readouterr().out
    assert ours == theirs and "[b]" not in ours
    utils.test_prompt("One two three", [f"w{i}" for i in range(12)], model, top_k=0)  # a long ranks line
    ranks_line = capsys.readouterr().out.splitlines()[-1]
    assert ranks_line.startswith("Ranks of the answer tokens: [[(' w', ") and len(ranks_line) > 120


def test_test_prompt_reads_ranks_and_probabilities_as_a_hand_count_would(model, capsys):
    tokens = model.to_tokens("The cat sat on the")
    with torch.no_grad():
        probs = model(tokens)[0, -1].softmax(-1)
    mat = model.to_single_token(" mat")
    rank = int((probs > probs[mat]).sum())
    best = int(probs.argmax())
    utils.test_prompt("The cat sat on the", "mat", model, top_k=1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].startswith(f"Rank: {rank:<8} ") and lines[3].endswith(
        f"Prob: {probs[mat].item():6.2%} Token: | mat|"
    )
    assert lines[4].endswith(f"Token: |{model.tokenizer.decode(best)}|")
    assert lines[5] == f"Ranks of the answer tokens: [(' mat', {rank})]"


def test_test_prompt_refuses_bad_input(model):
    with pytest.raises(TypeError, match="answer must be a str or a non-empty list of str"):
        utils.test_prompt("The cat", [], model)
    with pytest.raises(TypeError, match="answer must be a str or a non-empty list of str"):
        utils.test_prompt("The cat", 5, model)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prompt must be a str"):
        utils.test_prompt(["The cat"], "sat", model)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"top_k=60000 is out of range: expected 0\.\.50257"):
        utils.test_prompt("The cat", "sat", model, top_k=60000)


# ----------------------------------------------------------------------------
# lm_accuracy
# ----------------------------------------------------------------------------
def test_lm_accuracy_counts_next_token_hits():
    tokens = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]])
    logits = torch.zeros(2, 4, 5)
    logits[0, 0, 2] = logits[0, 1, 3] = logits[0, 2, 0] = 1.0  # row 0: hit, hit, miss
    logits[1, 0, 3] = logits[1, 1, 0] = logits[1, 2, 1] = 1.0  # row 1: hit, miss, hit
    assert utils.lm_accuracy(logits, tokens, per_token=True).tolist() == [[True, True, False], [True, False, True]]
    assert utils.lm_accuracy(logits, tokens).item() == pytest.approx(4 / 6)


def test_lm_accuracy_equals_transformer_lens():
    tl_lm_accuracy = _tl("utilities").lm_accuracy
    gen = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(3, 9, 7, generator=gen), torch.randint(0, 7, (3, 9), generator=gen)
    assert utils.lm_accuracy(logits, tokens).item() == tl_lm_accuracy(logits, tokens).item() > 0
    assert torch.equal(
        utils.lm_accuracy(logits, tokens, per_token=True), tl_lm_accuracy(logits, tokens, per_token=True)
    )


def test_lm_accuracy_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"got logits \(2, 4, 5\) and tokens \(2, 3\)"):
        utils.lm_accuracy(torch.zeros(2, 4, 5), torch.zeros(2, 3, dtype=torch.long))


# ----------------------------------------------------------------------------
# induction_loss
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("prepend_bos", [None, False])
def test_induction_loss_equals_transformer_lens_under_the_same_seed(model, ref, prepend_bos):
    tl_induction_loss = _tl("evals").induction_loss
    torch.manual_seed(7)
    theirs = tl_induction_loss(ref, batch_size=2, subseq_len=30, prepend_bos=prepend_bos, device="cpu")
    torch.manual_seed(7)
    ours = evals.induction_loss(model, batch_size=2, subseq_len=30, prepend_bos=prepend_bos)
    torch.manual_seed(7)
    theirs_on_ours = tl_induction_loss(model, batch_size=2, subseq_len=30, prepend_bos=prepend_bos, device="cpu")
    assert ours.shape == () and ours.item() > 0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(theirs_on_ours, ours, atol=1e-6, rtol=1e-6)
    torch.manual_seed(8)
    assert abs(evals.induction_loss(model, batch_size=2, subseq_len=30).item() - ours.item()) > 1e-3  # the seed matters


def test_induction_loss_is_low_for_a_model_with_an_induction_head():
    """The planted model's L1H0 copies the token after an earlier copy: the second half is predicted,
    where a random model of the same shape guesses (about log 15: its 16-token vocabulary draws from
    all ids but the trailing end-of-text one). Short halves, so chance repeats rarely blur the copy."""
    planted = planted_heads_model()
    random_model = GPT(planted.cfg, tokenizer=planted.tokenizer)
    random_model.init_weights(seed=0)
    torch.manual_seed(0)
    loss = evals.induction_loss(planted, batch_size=16, subseq_len=4)
    torch.manual_seed(0)
    guess = evals.induction_loss(random_model, batch_size=16, subseq_len=4)
    assert loss.item() < 0.3 and guess.item() > 2.5


def test_induction_loss_refuses_a_sequence_longer_than_the_context(model):
    with pytest.raises(ValueError, match=r"subseq_len=384 makes 768 tokens, longer than the model's context of 64"):
        evals.induction_loss(model)
    with pytest.raises(ValueError, match="batch_size=0 is out of range"):
        evals.induction_loss(model, batch_size=0, subseq_len=8)


# ----------------------------------------------------------------------------
# IOI
# ----------------------------------------------------------------------------
def test_shipped_ioi_data_is_transformer_lens_defaults():
    tl_dataset = _tl("evals").IOIDataset
    assert evals.IOIDataset.get_default_templates() == tl_dataset.get_default_templates()
    assert evals.IOIDataset.get_default_names() == tl_dataset.get_default_names()
    assert evals.IOIDataset.get_default_nouns() == tl_dataset.get_default_nouns()


def test_ioi_data_is_declared_package_data():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["interp_gpt"]
    package = REPO / "interp_gpt"
    assert any(package / "data" / "ioi.json" in set(package.glob(p)) for p in patterns)


CUSTOM = dict(
    templates=["[A] met with [B]. [B] gave the [OBJECT] to [A]", "[B] saw [A] at the [PLACE]; [B] waved to [A]"],
    names=["Alice", "Bob", "Charlie", "Dana"],
    nouns={"OBJECT": ["ball", "book"], "PLACE": ["park", "zoo", "gym"]},
)


@pytest.mark.parametrize(
    "kwargs", [{}, {"symmetric": True}, CUSTOM, {**CUSTOM, "symmetric": True, "prepend_bos": False}]
)
def test_ioi_dataset_equals_transformer_lens_for_the_same_seed(model, plain_tok, kwargs):
    tl_dataset = _tl("evals").IOIDataset
    theirs = tl_dataset(plain_tok, num_samples=25, seed=11, **kwargs)
    ours = evals.IOIDataset(model.tokenizer, num_samples=25, seed=11, **kwargs)
    ours_hf = evals.IOIDataset(plain_tok, num_samples=25, seed=11, **kwargs)
    assert len(ours) == len(theirs) == (24 if kwargs.get("symmetric") else 25)
    assert ours.samples == theirs.samples
    assert len({s["text"] for s in ours.samples}) > 1
    for i in range(len(ours)):
        for key in ("prompt", "IO", "S"):
            assert torch.equal(ours[i][key], theirs[i][key]) and torch.equal(ours_hf[i][key], theirs[i][key])


def test_ioi_dataset_seed_leaves_the_global_random_state_alone(model):
    before = random.getstate()
    evals.IOIDataset(model.tokenizer, num_samples=5, seed=3)
    assert random.getstate() == before
    random.seed(3)  # unseeded, it draws from the global generator: seeding that gives the seeded samples
    unseeded = evals.IOIDataset(model.tokenizer, num_samples=5)
    assert unseeded.samples == evals.IOIDataset(model.tokenizer, num_samples=5, seed=3).samples


def test_ioi_dataset_puts_one_bos_first_even_with_a_bos_adding_tokenizer(model, gpt2_vocab_dir):
    """transformer-lens 3.9 encodes with the tokenizer's special tokens: with its own GPT-2 tokenizer
    (add_bos_token=True) every prompt starts with two BOS. We (and transformer-lens 4.3) put one."""
    bos_tok = tl_gpt2.hf_tokenizer(gpt2_vocab_dir, add_bos_token=True)
    ours = evals.IOIDataset(bos_tok, num_samples=3, seed=0)
    bos = model.tokenizer.bos_token_id
    assert ours[0]["prompt"][0] == bos and ours[0]["prompt"][1] != bos and ours[0]["IO"].tolist() != [bos]
    assert torch.equal(ours[0]["prompt"], evals.IOIDataset(model.tokenizer, num_samples=3, seed=0)[0]["prompt"])
    theirs = _tl("evals").IOIDataset(bos_tok, num_samples=3, seed=0)
    if tl_gpt2.tl_major() >= 4:
        assert torch.equal(theirs[0]["prompt"], ours[0]["prompt"])
    else:
        assert theirs[0]["prompt"][:2].tolist() == [bos, bos]
        assert torch.equal(theirs[0]["prompt"][1:], ours[0]["prompt"])


def test_ioi_eval_equals_transformer_lens(model, ref, plain_tok):
    tl_evals = _tl("evals")
    dataset = evals.IOIDataset(model.tokenizer, num_samples=40, seed=1, **CUSTOM)
    theirs = tl_evals.ioi_eval(ref, dataset=tl_evals.IOIDataset(plain_tok, num_samples=40, seed=1, **CUSTOM))
    ours = evals.ioi_eval(model, dataset=dataset, batch_size=7)
    theirs_on_ours = tl_evals.ioi_eval(model, dataset=dataset)
    assert list(ours) == list(theirs) == ["Logit Difference", "Accuracy"]
    assert 0 < ours["Accuracy"] < 1 and ours["Logit Difference"] != 0
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-5)
        assert ours[key] == pytest.approx(theirs_on_ours[key], abs=1e-6)


def test_ioi_eval_default_dataset_draws_as_transformer_lens_does(model, ref, plain_tok):
    tl_evals = _tl("evals")
    random.seed(4)
    theirs = tl_evals.ioi_eval(ref, num_samples=16, tokenizer=plain_tok, symmetric=True)
    random.seed(4)
    ours = evals.ioi_eval(model, num_samples=16, symmetric=True)
    for key in ours:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-5)


def test_ioi_eval_reads_the_logit_difference_where_the_names_differ(model):
    """By hand: the logits of the position before the IO name, IO minus S."""
    dataset = evals.IOIDataset(model.tokenizer, num_samples=6, seed=2, names=["Alice", "Bob"])
    diffs = []
    for i in range(len(dataset)):
        item = dataset[i]
        with torch.no_grad():
            logits = model(item["prompt"][None])[0, -2]
        diffs.append((logits[item["IO"][0]] - logits[item["S"][0]]).item())
    result = evals.ioi_eval(model, dataset=dataset)
    assert result["Logit Difference"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    assert result["Accuracy"] == sum(d > 0 for d in diffs) / len(diffs)


def test_ioi_refuses_bad_input(model):
    with pytest.raises(ValueError, match="needs at least two different names"):
        evals.IOIDataset(model.tokenizer, names=["Ann", "Ann"])
    with pytest.raises(ValueError, match=r"nouns\['OBJECT'\] is empty"):
        evals.IOIDataset(model.tokenizer, nouns={"OBJECT": []})
    with pytest.raises(ValueError, match="num_samples=1 is out of range"):
        evals.IOIDataset(model.tokenizer, num_samples=1, symmetric=True)
    with pytest.raises(TypeError, match="tokenizer must have encode"):
        evals.IOIDataset(None)
    with pytest.raises(TypeError, match=r"templates\[0\] must be a str"):
        evals.IOIDataset(model.tokenizer, templates=[3])  # type: ignore[list-item]
    same = evals.IOIDataset(model.tokenizer, num_samples=2, seed=0, names=["Ann", "Ann Lee"])  # " Ann" starts both
    with pytest.raises(ValueError, match="do not differ"):
        evals.ioi_eval(model, dataset=same)


# ----------------------------------------------------------------------------
# evaluate_on_dataset / evaluate / sanity_check
# ----------------------------------------------------------------------------
def _loader(model):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(5)
    batches = torch.randint(0, 50257, (5, 2, 12), generator=gen)
    return [{"tokens": b} for b in batches]


def test_evaluate_on_dataset_equals_transformer_lens(model, ref):
    tl_evals = _tl("evals")
    for truncate in (100, 2):
        theirs = tl_evals.evaluate_on_dataset(ref, _loader(model), truncate=truncate, device="cpu")
        ours = evals.evaluate_on_dataset(model, _loader(model), truncate=truncate)
        assert ours == pytest.approx(theirs, abs=1e-5)
    by_hand = sum(model(b["tokens"], return_type="loss").item() for b in _loader(model)[:3]) / 3
    assert ours == pytest.approx(by_hand, abs=1e-5)  # truncate=2: three batches, as transformer-lens counts


def test_evaluate_runs_on_given_loaders_and_says_what_to_pass_otherwise(model, capsys):
    losses = evals.evaluate(model, data_loaders={"mine": _loader(model)})
    assert list(losses) == ["mine_loss"]
    assert capsys.readouterr().out.splitlines()[-1] == f"mine: {losses['mine_loss']}"
    with pytest.raises(ValueError, match="pass data_loaders="):
        evals.evaluate(model)


def test_sanity_check_equals_transformer_lens(model, ref):
    torch.testing.assert_close(evals.sanity_check(model), _tl("evals").sanity_check(ref), atol=1e-4, rtol=1e-4)
