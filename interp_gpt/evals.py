"""Rough evals, as transformer-lens' `evals` module has them (same names, arguments and numbers):

    induction_loss       loss on the second half of repeated random tokens (low: induction heads)
    IOIDataset           indirect-object-identification prompts from templates and names
    ioi_eval             mean logit difference (IO - S) and accuracy on an IOIDataset
    evaluate_on_dataset  mean loss over a data loader of token batches
    evaluate             that, for several named data loaders
    sanity_check         the loss on one paragraph of English (< 5 fine, > 7 broken)

`from interp_gpt import evals` ports `evals.induction_loss(model)` and `evals.ioi_eval(model)`
from transformer-lens unchanged. The IOI templates, names and nouns are transformer-lens'
defaults, shipped as package data (`interp_gpt/data/ioi.json`), so nothing is downloaded.

Deliberate differences from transformer-lens 3.9:
- `device` defaults to the model's device (transformer-lens: "cuda").
- `IOIDataset(seed=...)` draws from its own `random.Random(seed)`: the same samples as
  transformer-lens' `random.seed(seed)`, without reseeding Python's global generator.
- `IOIDataset` encodes without the tokenizer's special tokens, as transformer-lens 4.3 does;
  3.9 calls `tokenizer.encode(text)`, which with its own GPT-2 tokenizer (`add_bos_token=True`)
  gives every prompt two BOS tokens. With a tokenizer that adds none, 3.9 and we agree.
- `evaluate` runs on data loaders you pass (`data_loaders={"wiki": loader, ...}`): interp_gpt
  does not download transformer-lens' four corpora (that needs the `datasets` library and the hub).
"""

from __future__ import annotations

import copy
import functools
import json
import random
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

import einops
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm  # type: ignore[import-untyped]

from .checks import check_int_in_range, check_str_list
from .inspect import random_token_range
from .tokenizer.bpe import Tokenizer
from .utils import lm_cross_entropy_loss

__all__ = [
    "sanity_check",
    "evaluate_on_dataset",
    "evaluate",
    "induction_loss",
    "IOIDataset",
    "ioi_eval",
]


def _model_device(model: Any) -> torch.device:
    """Where the model's weights are (transformer-lens models also say it in cfg.device)."""
    device = getattr(model.cfg, "device", None)
    if device is not None:
        return torch.device(device)
    return next(model.parameters()).device


def sanity_check(model: Any) -> torch.Tensor:
    """The model's loss on the first paragraph of "Zoom In" (Circuits): < 5 looks fine, > 7 broken.

    Example:
        >>> evals.sanity_check(GPT.from_pretrained("tiny-gpt2"))  # a small model trained on novels
        tensor(5.5883, grad_fn=<MeanBackward0>)
    """
    text = (
        "Many important transition points in the history of science have been moments when science 'zoomed in.' "
        "At these points, we develop a visualization or tool that allows us to see the world in a new level of "
        "detail, and a new field of science develops to study the world through this lens."
    )
    return model(text, return_type="loss")


@torch.inference_mode()
def evaluate_on_dataset(
    model: Any, data_loader: Iterable[Any], truncate: int = 100, device: str | torch.device | None = None
) -> float:
    """Mean loss over the batches of `data_loader` (at most `truncate + 1` of them, as transformer-lens counts).

    Each batch is a dict with `"tokens"` `[batch, posn]` (what transformer-lens' tokenized datasets
    give) or a tensor of token ids. `device` defaults to the model's.

    Example:
        >>> loader = DataLoader([{"tokens": row} for row in tokens], batch_size=8)  # tokens: [n, posn]
        >>> loss = evals.evaluate_on_dataset(model, loader)                       # a float
    """
    truncate = check_int_in_range(truncate, "truncate", 0, None, caller="evaluate_on_dataset")
    device = _model_device(model) if device is None else device
    running_loss, total = 0.0, 0
    for batch in tqdm(data_loader):
        tokens = batch["tokens"] if isinstance(batch, Mapping) else batch
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(
                "evaluate_on_dataset: each batch of data_loader must be a tensor of token ids or a dict with "
                f"'tokens', got {type(batch).__name__}"
            )
        running_loss += model(tokens.to(device), return_type="loss").mean().item()
        total += 1
        if total > truncate:
            break
    if total == 0:
        raise ValueError("evaluate_on_dataset: data_loader gave no batch")
    return running_loss / total


@torch.inference_mode()
def evaluate(
    model: Any,
    truncate: int = 100,
    batch_size: int = 8,
    tokenizer: Any = None,
    *,
    data_loaders: Mapping[str, Iterable[Any]] | None = None,
) -> dict[str, float]:
    """`evaluate_on_dataset` on each named data loader: prints `"{name}: {loss}"` and returns
    `{"{name}_loss": loss}`, as transformer-lens' `evaluate` does for wiki, owt, pile and code.

    transformer-lens builds those four loaders from the hub with the `datasets` library; interp_gpt
    downloads nothing, so pass your own loaders (`batch_size` and `tokenizer` are for that
    signature's sake: your loaders are already batched and tokenized).

    Example:
        >>> wiki_loader = [{"tokens": model.to_tokens(["The cat sat on the mat.", "It was a dark night."])}]
        >>> code_loader = [{"tokens": model.to_tokens("def f(x): return x")}]
        >>> losses = evals.evaluate(model, data_loaders={"wiki": wiki_loader, "code": code_loader})
        wiki: ...
        code: ...
        >>> list(losses)
        ['wiki_loss', 'code_loss']
    """
    if data_loaders is None:
        raise ValueError(
            "evaluate: pass data_loaders={'wiki': loader, ...} (batches of {'tokens': [batch, posn]}); "
            "transformer-lens downloads wikitext, openwebtext, the pile and codeparrot with the `datasets` "
            "library, which interp_gpt does not do"
        )
    if not isinstance(data_loaders, Mapping) or not data_loaders:
        raise TypeError(f"evaluate: data_loaders must be a non-empty dict of name -> data loader, got {data_loaders!r}")
    losses = {}
    for data_name, data_loader in data_loaders.items():
        loss = evaluate_on_dataset(model, data_loader, truncate=truncate)
        print(f"{data_name}: {loss}")
        losses[f"{data_name}_loss"] = loss
    return losses


@torch.inference_mode()
def induction_loss(
    model: Any,
    tokenizer: Any = None,
    batch_size: int = 4,
    subseq_len: int = 384,
    prepend_bos: bool | None = None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """The loss on the second half of random tokens repeated twice: a model with induction heads
    predicts it well. As transformer-lens' `evals.induction_loss`, number for number under the same
    `torch.manual_seed`: ids drawn with `torch.randint(100, 20000, (batch_size, subseq_len))` from
    the global generator (for a vocabulary under 20,000 ids, from all of it but a trailing special
    token), repeated, the first overwritten by BOS when `prepend_bos` (default
    `cfg.default_prepend_bos`); the mean loss over positions `subseq_len + 2` onwards.

    `tokenizer` gives the BOS id (default the model's; a model without one uses its last id).
    `device` defaults to the model's. Returns a 0-d tensor.

    Example (the shipped tiny-gpt2, which has induction heads):
        >>> torch.manual_seed(0)
        >>> evals.induction_loss(GPT.from_pretrained("tiny-gpt2"), subseq_len=64)
        tensor(0.2813)
    """
    caller = "induction_loss"
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    subseq_len = check_int_in_range(subseq_len, "subseq_len", 1, None, caller=caller)
    if 2 * subseq_len > model.cfg.n_ctx:
        raise ValueError(
            f"{caller}: subseq_len={subseq_len} makes {2 * subseq_len} tokens, longer than the model's context of "
            f"{model.cfg.n_ctx}: use subseq_len <= {model.cfg.n_ctx // 2}"
        )
    device = _model_device(model) if device is None else device
    low, high = random_token_range(model)
    first_half_tokens = torch.randint(low, high, (batch_size, subseq_len)).to(device)
    repeated_tokens = einops.repeat(first_half_tokens, "b p -> b (2 p)")
    if model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos:
        tokenizer = model.tokenizer if tokenizer is None else tokenizer
        repeated_tokens[:, 0] = tokenizer.bos_token_id if tokenizer is not None else model.cfg.d_vocab - 1
    logits = model(repeated_tokens, return_type="logits")
    correct_log_probs = lm_cross_entropy_loss(logits, repeated_tokens, per_token=True)
    return correct_log_probs[:, subseq_len + 1 :].mean()


# ----------------------------------------------------------------------------
# indirect object identification
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _ioi_defaults() -> dict[str, Any]:
    """transformer-lens' default IOI templates, names and nouns, from the package data."""
    text = resources.files("interp_gpt").joinpath("data").joinpath("ioi.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` without special tokens (ours adds none; a Hugging Face one may add BOS)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer.encode(text)
    return list(tokenizer.encode(text, add_special_tokens=False))


class IOIDataset(Dataset):  # type: ignore[type-arg]
    """Indirect object identification prompts (Wang et al. 2022, arXiv:2211.00593), as
    transformer-lens' `evals.IOIDataset`: each sample fills a template's `[A]` and `[B]` with two
    different names and each other `[NOUN]` with a noun; the prompt ends with the indirect object
    `[A]` (IO), the other name is the subject `[B]` (S).

    Items are `{"prompt": LongTensor (BOS first with prepend_bos), "IO": ids of " " + IO, "S": ids of " " + S}`.
    `symmetric` draws `num_samples // 2` pairs, each also with the names swapped. The same `seed`
    gives transformer-lens' samples.

    Example:
        >>> ds = evals.IOIDataset(model.tokenizer, num_samples=100, seed=42)
        >>> ds.samples[0]
        {'text': 'Mary and John went to the store to buy bread. John handed the bread to Mary', 'IO': ' Mary', 'S': ' John'}
    """

    def __init__(
        self,
        tokenizer: Any,
        templates: list[str] | None = None,
        names: list[str] | None = None,
        nouns: dict[str, list[str]] | None = None,
        num_samples: int = 1000,
        symmetric: bool = False,
        prepend_bos: bool = True,
        seed: int | None = None,
    ) -> None:
        caller = "IOIDataset"
        if tokenizer is None or not hasattr(tokenizer, "encode") or not hasattr(tokenizer, "bos_token_id"):
            raise TypeError(
                f"{caller}: tokenizer must have encode() and bos_token_id (e.g. model.tokenizer), "
                f"got {type(tokenizer).__name__}"
            )
        self.tokenizer = tokenizer
        self.prepend_bos = prepend_bos
        num_samples = check_int_in_range(num_samples, "num_samples", 2 if symmetric else 1, None, caller=caller)
        self.templates = (
            self.get_default_templates() if templates is None else check_str_list(templates, "templates", caller)
        )
        self.names = self.get_default_names() if names is None else check_str_list(names, "names", caller)
        self.nouns = self.get_default_nouns() if nouns is None else _check_nouns(nouns, caller)
        if not self.templates:
            raise ValueError(f"{caller}: templates is empty; give at least one, e.g. '[A] met [B]. [B] waved to [A]'")
        if len(set(self.names)) < 2:
            raise ValueError(f"{caller}: names={self.names!r} needs at least two different names (IO and S)")
        # transformer-lens calls random.seed(seed): the same stream, but Python's global generator is left alone.
        self._random: Any = random if seed is None else random.Random(seed)
        self.samples: list[dict[str, str]] = []
        for _ in range(num_samples // 2 if symmetric else num_samples):
            self.samples.extend(self.get_sample(symmetric=symmetric))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        sample = self.samples[idx]
        prompt = _encode(self.tokenizer, sample["text"])
        if self.prepend_bos:
            prompt = [self.tokenizer.bos_token_id] + prompt
        return {
            "prompt": torch.LongTensor(prompt),
            "IO": torch.LongTensor(_encode(self.tokenizer, sample["IO"])),
            "S": torch.LongTensor(_encode(self.tokenizer, sample["S"])),
        }

    def get_sample(self, symmetric: bool = False) -> list[dict[str, str]]:
        """One sample (two with `symmetric`: the same template and nouns, the names swapped)."""
        template: str = self._random.choice(self.templates)
        for noun_type, noun_list in self.nouns.items():
            template = template.replace(f"[{noun_type}]", self._random.choice(noun_list))
        names = self._random.sample(self.names, 2)
        samples = [_fill(template, names[0], names[1])]
        if symmetric:
            samples.append(_fill(template, names[1], names[0]))
        return samples

    @staticmethod
    def get_default_names() -> list[str]:
        """The names IOI prompts are built from (transformer-lens' list)."""
        return list(_ioi_defaults()["names"])

    @staticmethod
    def get_default_templates() -> list[str]:
        """The IOI templates, with [A], [B], [PLACE] and [OBJECT] to fill."""
        return list(_ioi_defaults()["templates"])

    @staticmethod
    def get_default_nouns() -> dict[str, list[str]]:
        """The nouns that fill the templates' [PLACE] and [OBJECT] slots."""
        return copy.deepcopy(_ioi_defaults()["nouns"])


def _fill(template: str, io: str, s: str) -> dict[str, str]:
    # The answers get a leading space: the target is " Mary", not "Mary".
    return {"text": template.replace("[A]", io).replace("[B]", s), "IO": " " + io, "S": " " + s}


def _check_nouns(nouns: Any, caller: str) -> dict[str, list[str]]:
    if not isinstance(nouns, Mapping):
        raise TypeError(f"{caller}: nouns must be a dict of placeholder -> list of nouns, got {type(nouns).__name__}")
    checked = {}
    for key, words in nouns.items():
        checked[key] = check_str_list(words, f"nouns[{key!r}]", caller)
        if not checked[key]:
            raise ValueError(f"{caller}: nouns[{key!r}] is empty; give at least one noun")
    return checked


@torch.inference_mode()
def ioi_eval(
    model: Any,
    dataset: Any = None,
    batch_size: int = 8,
    num_samples: int = 1000,
    tokenizer: Any = None,
    symmetric: bool = False,
) -> dict[str, float]:
    """The model on indirect object identification, as transformer-lens' `evals.ioi_eval`:
    `{"Logit Difference": mean (IO logit - S logit), "Accuracy": fraction with IO above S}`,
    read at the first token where the IO and S names differ.

    `dataset` yields dicts with "prompt", "IO" and "S" (default: a new
    `IOIDataset(tokenizer, num_samples=num_samples, symmetric=symmetric)`, unseeded as in
    transformer-lens); `tokenizer` defaults to the model's. Prompts are padded on the right.

    Example (tiny-gpt2, trained on novels, shows no IOI behaviour):
        >>> model = GPT.from_pretrained("tiny-gpt2")
        >>> evals.ioi_eval(model, dataset=evals.IOIDataset(model.tokenizer, num_samples=100, seed=42))
        {'Logit Difference': -0.5294..., 'Accuracy': 0.21}
    """
    caller = "ioi_eval"
    batch_size = check_int_in_range(batch_size, "batch_size", 1, None, caller=caller)
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    if dataset is None:
        if tokenizer is None:
            raise ValueError(f"{caller}: the model has no tokenizer: pass tokenizer=... or dataset=...")
        dataset = IOIDataset(tokenizer, num_samples=num_samples, symmetric=symmetric)
    if len(dataset) == 0:
        raise ValueError(f"{caller}: dataset is empty")
    device = _model_device(model)

    def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        prompts = [sample["prompt"] for sample in samples]
        return {
            "prompt": torch.nn.utils.rnn.pad_sequence(prompts, batch_first=True),
            "IO": [sample["IO"] for sample in samples],
            "S": [sample["S"] for sample in samples],
            "prompt_length": [p.shape[0] for p in prompts],
        }

    # Shuffled as transformer-lens does (the order changes nothing but the global torch generator's state).
    data_loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate)
    total_correct, total_logit_diff = 0, 0.0
    for batch in tqdm(data_loader):
        batch_logits = model(batch["prompt"].to(device), return_type="logits")
        for i in range(batch_logits.shape[0]):
            io, s = batch["IO"][i], batch["S"][i]
            prefix_length = batch["prompt_length"][i] - io.shape[0]  # the prompt ends with IO's tokens
            min_len = min(io.shape[0], s.shape[0])
            differ = torch.where(io[:min_len] != s[:min_len])[0]
            if len(differ) == 0:
                raise ValueError(
                    f"{caller}: a sample's IO {io.tolist()} and S {s.tolist()} tokens do not differ "
                    "(within the shorter of the two): there is no token to compare"
                )
            start_idx = int(differ[0])
            logits = batch_logits[i, prefix_length + start_idx - 1]
            logit_diff = logits[io[start_idx]] - logits[s[start_idx]]
            total_correct += int((logit_diff > 0).item())
            total_logit_diff += logit_diff.item()
    return {"Logit Difference": total_logit_diff / len(dataset), "Accuracy": total_correct / len(dataset)}
