"""MIB tasks offline: prompt pairs with a right and a wrong answer, read from local files in MIB's column
layouts or built from templates for any GPT-2 tokenizer (the shipped tiny-gpt2's too).

A task is what MIB's dataloader yields: a clean prompt, a counterfactual (corrupted) prompt of the same
token length, and the answer token ids `[correct, incorrect]`; its metric is MIB's `logit_diff` (the
correct answer's logit minus the incorrect one's at each prompt's last real token, averaged).

Example:
    >>> task = name_mover_task(model, n=16)
    >>> task.metric(model(task.clean))               # the clean logit difference
    >>> task = read_task("ioi_validation.jsonl", model)
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ...checks import check_int_in_range, check_seed, check_type
from ...model.gpt import GPT
from ...prepare import prompts

__all__ = ["Task", "read_task", "induction_task", "name_mover_task"]

# MIB's default counterfactual column per task family (dataset.py).
_DEFAULT_COUNTERFACTUALS = ("s2_io_flip_counterfactual", "symbol_counterfactual", "random_counterfactual")
_FLAT = ("clean", "corrupted", "correct_idx", "incorrect_idx")


@dataclass(frozen=True)
class Task:
    """Prompt pairs and answers: `clean` / `corrupted` `[n, pos]` token ids (right-padded), `lengths [n]`
    each row's real tokens (a clean row and its corrupted row have the same), `answers [n, 2]`
    (correct, incorrect token ids)."""

    name: str
    clean: Int[Tensor, "n pos"]
    corrupted: Int[Tensor, "n pos"]
    lengths: Int[Tensor, " n"]
    answers: Int[Tensor, "n 2"]

    def __post_init__(self) -> None:
        where = f"Task({self.name!r})"
        for arg in ("clean", "corrupted", "lengths", "answers"):
            t = getattr(self, arg)
            if not isinstance(t, Tensor) or t.is_floating_point() or t.dtype == torch.bool:
                got = t.dtype if isinstance(t, Tensor) else type(t).__name__
                raise TypeError(f"{where}: {arg} must be an integer tensor, got {got}")
        n = self.clean.shape[0] if self.clean.ndim == 2 else -1
        if self.clean.ndim != 2 or n == 0:
            raise ValueError(
                f"{where}: clean must be token ids [n, pos] with n >= 1, got shape {tuple(self.clean.shape)}"
            )
        if self.corrupted.shape != self.clean.shape:
            raise ValueError(
                f"{where}: corrupted has shape {tuple(self.corrupted.shape)}, clean {tuple(self.clean.shape)}: "
                "each clean prompt needs a counterfactual of the same length"
            )
        if self.lengths.shape != (n,) or bool((self.lengths < 1).any() | (self.lengths > self.clean.shape[1]).any()):
            raise ValueError(
                f"{where}: lengths must be [{n}] real-token counts in 1..{self.clean.shape[1]}, got {self.lengths.tolist()}"
            )
        if self.answers.shape != (n, 2):
            raise ValueError(
                f"{where}: answers must be [{n}, 2] (correct, incorrect token ids), got shape {tuple(self.answers.shape)}"
            )

    def __len__(self) -> int:
        return int(self.clean.shape[0])

    def __repr__(self) -> str:
        n = len(self)
        return f"Task({self.name!r}, {n} prompt pair{'' if n == 1 else 's'} of up to {self.clean.shape[1]} tokens)"

    @property
    def positions(self) -> list[int]:
        """The positions the metric reads (each row's last real token), for `logit_positions=`."""
        return sorted({int(n) - 1 for n in self.lengths})

    def logit_diff(self, logits: Float[Tensor, "n pos d_vocab"]) -> Float[Tensor, " n"]:
        """MIB's `logit_diff` per prompt: logit(correct) - logit(incorrect) at the last real token."""
        if logits.ndim != 3 or logits.shape[0] != len(self):
            raise ValueError(f"{self.name}: logits must be [{len(self)}, pos, d_vocab], got {tuple(logits.shape)}")
        rows = torch.arange(len(self), device=logits.device)
        last = logits[rows, self.lengths.to(logits.device) - 1]  # [n, d_vocab]
        pair = last.gather(-1, self.answers.to(logits.device))
        return pair[:, 0] - pair[:, 1]

    def metric(self, logits: Float[Tensor, "n pos d_vocab"]) -> Float[Tensor, ""]:
        """The mean logit difference over the prompts (what MIB averages)."""
        return self.logit_diff(logits).mean()

    def head(self, n: int) -> Task:
        """The first `n` prompt pairs."""
        n = check_int_in_range(n, "n", 1, len(self), "prompt counts", caller="Task.head")
        return Task(self.name, self.clean[:n], self.corrupted[:n], self.lengths[:n], self.answers[:n])

    @classmethod
    def from_text(
        cls, model: GPT, clean: Sequence[str], corrupted: Sequence[str], answers: Sequence[Any], name: str = "task"
    ) -> Task:
        """A task from prompt texts (BOS first, as MIB tokenizes) and answers `[(correct, incorrect), ...]`,
        each a token id or a text whose first token is the answer (`" Mary"`: mind the space).

        Example:
            >>> Task.from_text(model, ["When Mary and Anna met, Anna thanked"], ["When Mary and Anna met, Mary thanked"],
            ...                [(" Mary", " Anna")], name="ioi")
            Task('ioi', 1 prompt pair of up to 10 tokens)
        """
        caller = "Task.from_text"
        model = check_type(model, GPT, "model", "an interp_gpt GPT", caller)
        for arg, texts in (("clean", clean), ("corrupted", corrupted)):
            if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
                raise TypeError(f"{caller}: {arg} must be a non-empty list of prompts, got {type(texts).__name__}")
        if len(clean) != len(corrupted) or len(clean) != len(answers):
            raise ValueError(
                f"{caller}: clean has {len(clean)} prompts, corrupted {len(corrupted)} and answers {len(answers)}; "
                "give one corrupted prompt and one (correct, incorrect) pair per clean prompt"
            )
        a = prompts(model, list(clean), "clean", caller)
        b = prompts(model, list(corrupted), "corrupted", caller)
        assert a.lengths is not None and b.lengths is not None
        for row, (m, n) in enumerate(zip(a.lengths, b.lengths, strict=True)):
            if m != n:
                raise ValueError(
                    f"{caller}: row {row}: the clean prompt has {m} tokens, the corrupted one {n}; MIB's tasks pair "
                    f"prompts of one length (clean {clean[row]!r}, corrupted {corrupted[row]!r})"
                )
        ids = torch.tensor([[_answer_id(model, x, f"answers[{i}]", caller) for x in _pair(p, i, caller)]
                            for i, p in enumerate(answers)])  # fmt: skip
        lengths = torch.tensor(a.lengths)
        return cls(str(name), a.ids.cpu(), b.ids.cpu(), lengths, ids)


def _pair(p: Any, i: int, caller: str) -> tuple[Any, Any]:
    if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) != 2:
        raise ValueError(f"{caller}: answers[{i}] must be a (correct, incorrect) pair, got {p!r}")
    return p[0], p[1]


def _answer_id(model: GPT, x: Any, arg: str, caller: str) -> int:
    if isinstance(x, str):
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise ValueError(f"{caller}: {arg}: {x!r} is text but the model has no tokenizer; give token ids")
        ids = tok.encode(x)
        if not ids:
            raise ValueError(f"{caller}: {arg}: {x!r} has no tokens")
        return int(ids[0])
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{caller}: {arg}: {x!r} is not a token id or a text")
    return check_int_in_range(int(x), arg, 0, model.cfg.d_vocab - 1, "token ids", caller=caller)


# ----------------------------------------------------------------------------
# files in MIB's column layouts
# ----------------------------------------------------------------------------
def read_task(
    path: str | Path, model: GPT, *, counterfactual: str | None = None, n: int | None = None, name: str | None = None
) -> Task:
    """A task from a local file (`.csv`, `.json` or `.jsonl`) in one of MIB's column layouts:

    - its `EAPDataset` CSV: `clean`, `corrupted`, `correct_idx`, `incorrect_idx` (token ids);
    - its hub datasets' rows: `prompt` and a counterfactual column (`counterfactual=`, else the only
      `*_counterfactual` column, else MIB's default `s2_io_flip_counterfactual` / `symbol_counterfactual` /
      `random_counterfactual`) holding the counterfactual `prompt`, with the answers as MIB reads them:
      IOI's `metadata` (`" " + indirect_object` right, `" " + subject` wrong), multiple choice's `choices` /
      `answerKey` (the counterfactual's choice wrong) or arithmetic's `label` (the counterfactual's wrong).

    A file missing a column is refused naming it and the columns it has; a prompt pair of unequal token
    length naming the row. `n`: the first n rows (MIB's `--head`).

    Example:
        >>> _ = Path("task.csv").write_text("clean,corrupted,correct_idx,incorrect_idx\\nThe cat sat,The dog sat,5,6\\n")
        >>> read_task("task.csv", model)
        Task('task', 1 prompt pair of up to 5 tokens)
    """
    caller = "read_task"
    path = Path(path)
    rows = _rows(path, caller)
    if n is not None:
        n = check_int_in_range(n, "n", 1, None, "row counts", caller=caller)
        rows = rows[:n]
    where = f"{caller}: {str(path)!r}"
    first = rows[0]
    if all(k in first for k in _FLAT):
        clean, corrupted, answers = [], [], []
        for i, row in enumerate(rows):
            _need(row, _FLAT, i, where)
            clean.append(str(row["clean"]))
            corrupted.append(str(row["corrupted"]))
            answers.append((_int(row["correct_idx"], "correct_idx", i, where),
                            _int(row["incorrect_idx"], "incorrect_idx", i, where)))  # fmt: skip
        return Task.from_text(model, clean, corrupted, answers, name or path.stem)
    if "prompt" not in first:
        raise ValueError(
            f"{where}: row 0 has columns {sorted(first)}; expected MIB's layouts: {list(_FLAT)} (its EAPDataset CSV) "
            "or 'prompt' with a '*_counterfactual' column and the answers ('metadata', 'choices' + 'answerKey' "
            "or 'label')"
        )
    column = _counterfactual_column(first, counterfactual, where)
    clean, corrupted, answers = [], [], []
    for i, row in enumerate(rows):
        _need(row, ("prompt", column), i, where)
        cf = row[column]
        if not isinstance(cf, Mapping) or "prompt" not in cf:
            raise ValueError(f"{where}: row {i}: {column!r} must hold the counterfactual's 'prompt', got {cf!r}")
        clean.append(str(row["prompt"]))
        corrupted.append(str(cf["prompt"]))
        answers.append(_answers(row, cf, i, where))
    return Task.from_text(model, clean, corrupted, answers, name or path.stem)


def _rows(path: Path, caller: str) -> list[Mapping[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"{caller}: no file {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    rows: Any
    if path.suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    elif path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    elif path.suffix == ".json":
        rows = json.loads(text)
        if isinstance(rows, Mapping) and "rows" in rows:
            rows = rows["rows"]
    else:
        raise ValueError(f"{caller}: {str(path)!r}: expected a .csv, .json or .jsonl file")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, Mapping) for r in rows):
        raise ValueError(f"{caller}: {str(path)!r} holds no rows (expected a list of records with MIB's columns)")
    return rows


def _need(row: Mapping[str, Any], keys: Sequence[str], i: int, where: str) -> None:
    missing = [k for k in keys if k not in row or row[k] is None or row[k] == ""]
    if missing:
        raise ValueError(f"{where}: row {i} lacks column {missing[0]!r} (it has {sorted(row)})")


def _int(x: Any, col: str, i: int, where: str) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: row {i}: {col}={x!r} is not a token id") from None


def _counterfactual_column(row: Mapping[str, Any], given: str | None, where: str) -> str:
    found = [k for k in row if str(k).endswith("_counterfactual")]
    if given is not None:
        if given not in row:
            raise ValueError(
                f"{where}: counterfactual={given!r} is not a column; the counterfactual columns are {found}"
            )
        return given
    if len(found) == 1:
        return found[0]
    for default in _DEFAULT_COUNTERFACTUALS:
        if default in found:
            return default
    if not found:
        raise ValueError(f"{where}: row 0 has no '*_counterfactual' column (it has {sorted(row)})")
    raise ValueError(f"{where}: several counterfactual columns {found}: choose one with counterfactual=")


def _answers(row: Mapping[str, Any], cf: Mapping[str, Any], i: int, where: str) -> tuple[Any, Any]:
    meta = row.get("metadata")
    if isinstance(meta, Mapping) and "indirect_object" in meta and "subject" in meta:
        return f" {meta['indirect_object']}", f" {meta['subject']}"
    if "choices" in row and "answerKey" in row:
        try:
            right = row["choices"]["label"][int(row["answerKey"])]
            wrong = cf["choices"]["label"][int(cf["answerKey"])]
        except (KeyError, TypeError, IndexError, ValueError):
            raise ValueError(
                f"{where}: row {i}: 'choices' / 'answerKey' (and the counterfactual's) must give choices['label'][answerKey]"
            ) from None
        return str(right), str(wrong)
    if "label" in row:
        if "label" not in cf:
            raise ValueError(f"{where}: row {i}: the counterfactual lacks 'label' (its wrong answer)")
        return str(row["label"]), str(cf["label"])
    raise ValueError(
        f"{where}: row {i} has no answers: expected 'metadata' (indirect_object, subject), 'choices' + "
        f"'answerKey' or 'label' (it has {sorted(row)})"
    )


# ----------------------------------------------------------------------------
# tasks built offline from templates
# ----------------------------------------------------------------------------
def induction_task(model: GPT, n: int = 24, half: int = 6, seed: int = 0) -> Task:
    """Induction: `[BOS] r1 .. rk r1 .. r(k-1)`, answer `rk`; the corrupted prompt's first `rk` is another
    token `s` (its induction answer, the wrong one). Random tokens of the model's vocabulary (`half` = k).

    Example:
        >>> task = induction_task(model, n=16)
        >>> task.clean.shape, task.answers.shape
        (torch.Size([16, 12]), torch.Size([16, 2]))
    """
    caller = "induction_task"
    model = check_type(model, GPT, "model", "an interp_gpt GPT", caller)
    n = check_int_in_range(n, "n", 1, None, "prompt counts", caller=caller)
    half = check_int_in_range(half, "half", 2, (model.cfg.n_ctx - 1) // 2, "tokens", caller=caller)
    gen = torch.Generator().manual_seed(check_seed(seed, caller=caller))
    vocab = model.cfg.d_vocab
    bos = _bos(model)
    pool = torch.tensor([t for t in range(min(vocab, 50000)) if t != bos])
    clean, corrupted, answers = [], [], []
    for _ in range(n):
        picks = pool[torch.randperm(len(pool), generator=gen)[: half + 1]]
        seq, s = picks[:half], picks[half]
        bad = seq.clone()
        bad[-1] = s
        clean.append(torch.cat([torch.tensor([bos]), seq, seq[:-1]]))
        corrupted.append(torch.cat([torch.tensor([bos]), bad, seq[:-1]]))
        answers.append([int(seq[-1]), int(s)])
    c = torch.stack(clean)
    return Task("induction", c, torch.stack(corrupted), torch.full((n,), c.shape[1]), torch.tensor(answers))


def _bos(model: GPT) -> int:
    tok = getattr(model, "tokenizer", None)
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    return int(bos) if bos is not None else model.cfg.d_vocab - 1


# Names tried for the name-mover task, kept where " Name" is one token of the model's vocabulary
# (GPT-2's tokenizer keeps the common English ones, tiny-gpt2's the names of its novel).
_NAMES = (
    "Mary", "John", "Anna", "Pierre", "Andrew", "Natasha", "Nicholas", "Napoleon", "Sonya", "Boris", "Petya",
    "Anatole", "Denisov", "Dolokhov", "Kutuzov", "Vasili", "James", "David", "Sarah", "Paul", "Peter", "Michael",
)  # fmt: skip
_TEMPLATES = (
    "When{a} and{b} went to the house,{b} gave a letter to",
    "When{a} and{b} came to Moscow,{b} said to",
    "After{a} and{b} met the Prince,{b} wrote to",
    "Then{a} and{b} went out, and{b} looked at",
)


def name_mover_task(model: GPT, n: int = 24, seed: int = 0) -> Task:
    """An IOI-style (name mover) task: "When A and B went to the house, B gave a letter to" -> " A"; the
    corrupted prompt is MIB's `s2_io_flip` ("..., A gave a letter to", whose answer " B" is the wrong one).
    Names are those of a fixed list that the model's tokenizer keeps as one token after a space.

    Example:
        >>> task = name_mover_task(model, n=16)
        >>> model.to_string(task.clean[0, 1 : task.lengths[0]])
        'When Kutuzov and Napoleon went to the house, Napoleon gave a letter to'
    """
    caller = "name_mover_task"
    model = check_type(model, GPT, "model", "an interp_gpt GPT", caller)
    n = check_int_in_range(n, "n", 1, None, "prompt counts", caller=caller)
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError(f"{caller}: the model has no tokenizer; the task is built from text")
    names = [name for name in _NAMES if len(tok.encode(" " + name)) == 1]
    if len(names) < 3:
        raise ValueError(f"{caller}: the model's tokenizer keeps only {names} of {list(_NAMES)} as one token")
    rng = random.Random(check_seed(seed, caller=caller))
    clean, corrupted, answers = [], [], []
    for i in range(n):
        a, b = rng.sample(names, 2)
        head, _, tail = _TEMPLATES[i % len(_TEMPLATES)].rpartition("{b}")  # the second mention of B
        clean.append((head + "{b}" + tail).format(a=" " + a, b=" " + b))
        corrupted.append((head + "{a}" + tail).format(a=" " + a, b=" " + b))
        answers.append((" " + a, " " + b))
    return Task.from_text(model, clean, corrupted, answers, "name-mover")
