"""`Config(tokenizer_name=...)`: the model is built with the tokenizer the name stands for, as transformer-lens
builds one (issue 28), offline: a folder Hugging Face or `Tokenizer.save` wrote, a shipped model's name, GPT-2's
name, or a hub id found in the local Hugging Face cache; a name found nowhere is an error naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.tokenizer import char_tokenizer, gpt2_tokenizer
from interp_gpt.tokenizer.by_name import tokenizer_by_name

SMALL = dict(n_layers=1, d_model=16, n_heads=2, n_ctx=32)


@pytest.fixture
def hf_folder(tmp_path: Path, gpt2_vocab_dir: Path) -> Path:
    """GPT-2's tokenizer as Hugging Face's files: tokenizer.json and tokenizer_config.json (what
    `save_pretrained` writes), built offline from the shipped vocabulary."""
    gpt2_tokenizer(gpt2_vocab_dir).backend.save(str(tmp_path / "tokenizer.json"))
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(special), encoding="utf-8")
    return tmp_path


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_a_config_naming_a_folder_builds_a_model_with_that_tokenizer(hf_folder: Path, offline: None) -> None:
    model = GPT(Config(**SMALL, d_vocab=50257, tokenizer_name=str(hf_folder)))
    reference = gpt2_tokenizer()
    assert model.tokenizer is not None and model.tokenizer.bos_token_id == 50256 == model.tokenizer.pad_token_id
    text = "Hello world, the cat sat"
    assert model.to_tokens(text)[0].tolist() == [50256, *reference.encode(text)]
    assert model.to_string(15496) == "Hello"
    assert model.generate(text, max_new_tokens=3, do_sample=False, verbose=False).startswith(text)


def test_a_folder_that_hugging_face_saved_loads_as_transformers_reads_it(tmp_path: Path, offline: None) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2TokenizerFast(tokenizer_object=gpt2_tokenizer().backend, eos_token="<|endoftext|>")
    hf.save_pretrained(tmp_path)
    ours = tokenizer_by_name(tmp_path)
    text = "When John and Mary went to the shops"
    assert ours.encode(text) == hf(text)["input_ids"]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (hf.eos_token_id,) * 3  # TL's defaults


def test_a_folder_without_tokenizer_json_goes_through_transformers(
    tmp_path: Path, gpt2_vocab_dir: Path, offline: None
) -> None:
    pytest.importorskip("transformers")
    shutil.copy(gpt2_vocab_dir / "encoder.json", tmp_path / "vocab.json")  # Hugging Face's names for OpenAI's files
    shutil.copy(gpt2_vocab_dir / "vocab.bpe", tmp_path / "merges.txt")
    config = {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    loaded = tokenizer_by_name(tmp_path)
    assert loaded.encode("Hello world") == [15496, 995] and loaded.bos_token_id == 50256


def test_special_tokens_follow_the_config_and_transformer_lens_defaults(tmp_path: Path) -> None:
    tok = char_tokenizer("abc")  # <|endoftext|> is id 3
    tok.backend.add_special_tokens(["<pad>"])  # id 4
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"pad_token": {"content": "<pad>"}}))
    loaded = tokenizer_by_name(tmp_path)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (3, 3, 4)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<none>"}))
    with pytest.raises(ValueError, match="no eos token"):
        tokenizer_by_name(tmp_path)


def test_shipped_gpt2_and_saved_names(tmp_path: Path) -> None:
    assert tokenizer_by_name("tiny-gpt2").name == "tiny-gpt2"
    assert GPT(Config(**SMALL, d_vocab=2048, tokenizer_name="tiny-gpt2")).tokenizer.encode("the cat") == [422, 280, 294]
    assert tokenizer_by_name("gpt2").encode("Hello world") == [15496, 995]
    saved = char_tokenizer("xyz ", name="mine").save(tmp_path / "saved")
    assert tokenizer_by_name(saved).name == "mine"


def test_a_name_found_nowhere_is_an_error_naming_it(tmp_path: Path, offline: None) -> None:
    with pytest.raises(ValueError, match=r"tokenizer_name='EleutherAI/gpt-neox-20b'.*local Hugging Face cache"):
        GPT(Config(**SMALL, d_vocab=50278, tokenizer_name="EleutherAI/gpt-neox-20b"))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        tokenizer_by_name(tmp_path / "a_file")
    with pytest.raises(ValueError, match="tokenizer_name=.*needs transformers|cannot read"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "vocab.txt").write_text("")
        tokenizer_by_name(tmp_path / "empty")


def test_no_name_no_tokenizer_and_an_explicit_tokenizer_wins(offline: None) -> None:
    assert Config().tokenizer_name is None  # transformer-lens' default
    assert GPT(Config(**SMALL, d_vocab=10)).tokenizer is None
    tok = char_tokenizer("abcdefghi")
    assert GPT(Config(**SMALL, d_vocab=10, tokenizer_name="EleutherAI/gpt-neox-20b"), tokenizer=tok).tokenizer is tok


def test_from_pretrained_attaches_the_checkpoints_own_and_loads_no_name(offline: None) -> None:
    from interp_gpt.config import preset

    assert preset("gpt2").tokenizer_name == "gpt2"
    raw = GPT.from_pretrained_no_processing("tiny-gpt2").cfg.to_dict()
    cfg = Config.from_dict({**raw, "tokenizer_name": "nobody/nothing"})
    model = GPT.from_pretrained("tiny-gpt2", config=cfg)  # the name is not looked up: the checkpoint has its own
    assert model.tokenizer is not None and model.tokenizer.name == "tiny-gpt2"
    assert model.cfg.tokenizer_name == "nobody/nothing"
    assert torch.equal(model.to_tokens("the cat"), GPT.from_pretrained("tiny-gpt2").to_tokens("the cat"))
