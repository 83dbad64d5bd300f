"""head_detector.detect_head against transformer-lens' on one random GPT-2 with GPT-2's vocabulary
(3.9's HookedTransformer or 4.x's TransformerBridge: see tests/tl_gpt2.py), every built-in pattern
and option; on the planted model against the heads set by hand; and its errors."""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tl_gpt2  # noqa: E402

from interp_gpt import head_detector  # noqa: E402
from interp_gpt.head_detector import detect_head  # noqa: E402
from interp_gpt.inspect import planted_heads_model  # noqa: E402

TEXT = "one two three four one two three four five five"  # repeats, and one token twice in a row
OPTIONS = list(itertools.product(head_detector.HEAD_NAMES, [False, True], [False, True], ["mul", "abs"]))


@pytest.fixture(scope="module")
def hf():  # type: ignore[no-untyped-def]
    return tl_gpt2.hf_gpt2()


@pytest.fixture(scope="module")
def model(hf, gpt2_vocab_dir):  # type: ignore[no-untyped-def]
    return tl_gpt2.ours(hf, gpt2_vocab_dir)


@pytest.fixture(scope="module")
def ref(hf, gpt2_vocab_dir):  # type: ignore[no-untyped-def]
    return tl_gpt2.reference(hf, gpt2_vocab_dir)


def _tl():  # type: ignore[no-untyped-def]
    return pytest.importorskip("transformer_lens.head_detector")


def _close(ours: torch.Tensor, theirs: torch.Tensor, error_measure: str) -> None:
    assert ours.shape == theirs.shape == (2, 4)
    # "abs" rounds to 3 decimals, so float noise between the two models can move a score by 0.001.
    torch.testing.assert_close(ours, theirs.to(ours.dtype), atol=1.1e-3 if error_measure == "abs" else 1e-5, rtol=0)


@pytest.mark.parametrize("pattern, exclude_bos, exclude_current_token, error_measure", OPTIONS)
def test_detect_head_equals_transformer_lens(model, ref, pattern, exclude_bos, exclude_current_token, error_measure):
    kwargs = dict(exclude_bos=exclude_bos, exclude_current_token=exclude_current_token, error_measure=error_measure)
    theirs = _tl().detect_head(ref, TEXT, pattern, **kwargs)
    ours = detect_head(model, TEXT, pattern, **kwargs)
    _close(ours, theirs, error_measure)
    assert len(set(ours.flatten().tolist())) > 1  # the heads differ: a wrong layer/head order would show


@pytest.mark.parametrize("error_measure", ["mul", "abs"])
def test_detect_head_on_a_list_of_prompts_and_some_heads_equals_transformer_lens(model, ref, error_measure):
    seqs = [TEXT, "a b c a b c", "The cat sat. The cat sat."]
    for heads in ([(0, 1), (1, 3), (1, 0)], {0: [2], 1: [0, 1]}):
        theirs = _tl().detect_head(ref, seqs, "induction_head", heads=heads, error_measure=error_measure)
        ours = detect_head(model, seqs, "induction_head", heads=heads, error_measure=error_measure)
        _close(ours, theirs, error_measure)
        assert int((ours == -1).sum()) == 8 - 3  # the heads not asked for get -1


@pytest.mark.parametrize("error_measure", ["mul", "abs"])
def test_detect_head_with_a_custom_pattern_equals_transformer_lens(model, ref, error_measure, caplog):
    n = model.to_tokens(TEXT).shape[-1]
    ones = torch.tril(torch.ones(n, n))
    ones[:, 0] = 0  # "attends anywhere but BOS"
    graded = torch.tril(torch.rand(n, n, generator=torch.Generator().manual_seed(0)))
    for pattern in (ones, graded):
        theirs = _tl().detect_head(ref, TEXT, pattern, error_measure=error_measure, exclude_current_token=True)
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            ours = detect_head(model, TEXT, pattern, error_measure=error_measure, exclude_current_token=True)
        _close(ours, theirs, error_measure)
        warned = "values other than 0 or 1" in caplog.text
        assert warned == (error_measure == "mul" and pattern is graded)


def test_detect_head_with_a_given_cache_equals_a_fresh_run_and_leaves_the_cache_alone(model):
    tokens = model.to_tokens(TEXT)
    _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    _, batched = model.run_with_cache(tokens)  # our cache may keep its batch axis of 1
    before = cache["pattern", 0].clone()
    for kwargs in (dict(exclude_bos=True, exclude_current_token=True), dict(error_measure="abs", exclude_bos=True)):
        fresh = detect_head(model, TEXT, "previous_token_head", **kwargs)  # type: ignore[arg-type]
        for given in (cache, batched):  # (a full cache's forward may round differently from a patterns-only one)
            torch.testing.assert_close(detect_head(model, TEXT, "previous_token_head", cache=given, **kwargs), fresh)  # type: ignore[arg-type]
    assert torch.equal(cache["pattern", 0], before)


def test_detection_patterns_equal_transformer_lens(model):
    tl = _tl()
    tokens = model.to_tokens(TEXT)
    for name in head_detector.HEAD_NAMES:
        ours = getattr(head_detector, f"get_{name}_detection_pattern")(tokens)
        theirs = getattr(tl, f"get_{name}_detection_pattern")(tokens)
        assert torch.equal(ours, theirs.to(ours.dtype)), name


def test_detection_patterns_by_hand():
    tokens = torch.tensor([[9, 5, 6, 5, 6, 6]])
    dup = head_detector.get_duplicate_token_head_detection_pattern(tokens)
    assert dup.nonzero().tolist() == [[3, 1], [4, 2], [5, 2], [5, 4]]
    ind = head_detector.get_induction_head_detection_pattern(tokens)
    assert ind.nonzero().tolist() == [[3, 2], [4, 3], [5, 3], [5, 5]]  # (5, 5): after the copy at 4 comes 5 itself
    prev = head_detector.get_previous_token_head_detection_pattern(tokens)
    assert prev.nonzero().tolist() == [[q, q - 1] for q in range(1, 6)]


def test_detect_head_finds_the_planted_heads():
    """planted_heads_model: L0H0 previous-token, L0H1 duplicate-token, L1H0 induction, set by hand."""
    planted = planted_heads_model()
    text = "abcdefgh" * 2
    for name, (layer, head) in [
        ("previous_token_head", (0, 0)),
        ("duplicate_token_head", (0, 1)),
        ("induction_head", (1, 0)),
    ]:
        scores = detect_head(planted, text, name, exclude_bos=True)
        assert divmod(int(scores.argmax()), planted.cfg.n_heads) == (layer, head), name
        # Half the queries have no earlier copy (and put their attention elsewhere): "mul" counts them too.
        assert scores[layer, head] > 0.5 and scores.flatten().sort().values[-2] < scores[layer, head] / 2, name


def test_transformer_lens_detect_head_runs_on_our_model(model, ref, monkeypatch):
    """transformer-lens' detect_head reads cfg.device and cfg.dtype; where our Config lacks them
    (another change adds cfg.device), they are set here so that the rest of the call is checked."""
    if not hasattr(model.cfg, "device"):
        monkeypatch.setattr(model.cfg, "device", "cpu", raising=False)
    if not hasattr(model.cfg, "dtype"):
        monkeypatch.setattr(model.cfg, "dtype", torch.float32, raising=False)
    tl = _tl()
    for pattern, error_measure in [("induction_head", "mul"), ("previous_token_head", "abs")]:
        on_ours = tl.detect_head(model, TEXT, pattern, error_measure=error_measure, exclude_bos=True)
        on_theirs = tl.detect_head(ref, TEXT, pattern, error_measure=error_measure, exclude_bos=True)
        _close(on_ours, on_theirs, error_measure)


def test_get_supported_heads_prints_what_transformer_lens_prints(capsys):
    _tl().get_supported_heads()
    theirs = capsys.readouterr().out
    head_detector.get_supported_heads()
    assert capsys.readouterr().out == theirs


def test_detect_head_refuses_bad_input(model):
    n = model.to_tokens(TEXT).shape[-1]
    with pytest.raises(
        ValueError,
        match=r"'induction' is not a known head name; known: \['previous_token_head'.*did you mean 'induction_head'",
    ):
        detect_head(model, TEXT, "induction")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"detection_pattern has shape \({n + 1}, {n + 1}\), expected \({n}, {n}\)"):
        detect_head(model, TEXT, torch.zeros(n + 1, n + 1))
    with pytest.raises(ValueError, match=rf"detection_pattern has shape \({n}, {n - 1}\), expected"):
        detect_head(model, TEXT, torch.zeros(n, n - 1), exclude_bos=True, exclude_current_token=True)
    with pytest.raises(ValueError, match="must be lower triangular"):
        detect_head(model, TEXT, torch.ones(n, n))
    with pytest.raises(TypeError, match="detection_pattern must be a \\[pos, pos\\] tensor or one of"):
        detect_head(model, TEXT, [[0, 1], [0, 0]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="error_measure='sq' is not one of \\['abs', 'mul'\\]"):
        detect_head(model, TEXT, "induction_head", error_measure="sq")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a detection_pattern tensor fits one prompt, got a list of 2"):
        detect_head(model, [TEXT, TEXT], torch.zeros(n, n))
    _, cache = model.run_with_cache(TEXT, remove_batch_dim=True)
    with pytest.raises(ValueError, match="cannot be given with a list seq"):
        detect_head(model, [TEXT, TEXT], "induction_head", cache=cache)
    with pytest.raises(ValueError, match=rf"cache's layer 0 pattern has shape \(4, {n}, {n}\), but seq is 3 tokens"):
        detect_head(model, "a b", "induction_head", cache=cache)
    with pytest.raises(ValueError, match=r"heads holds layer 2; layers are 0\.\.1"):
        detect_head(model, TEXT, "induction_head", heads=[(2, 0)])
    with pytest.raises(ValueError, match=r"heads holds head 4; heads are 0\.\.3"):
        detect_head(model, TEXT, "induction_head", heads={1: [4]})
    with pytest.raises(ValueError, match=r"seq is 1 tokens; it must be 2\.\.63"):
        detect_head(model, "", "previous_token_head")
    with pytest.raises(ValueError, match=r"seq is 64 tokens; it must be 2\.\.63"):
        detect_head(model, " a" * 63, "previous_token_head")
    with pytest.raises(TypeError, match="seq must be a str or a list of str"):
        detect_head(model, 5, "previous_token_head")  # type: ignore[arg-type]
