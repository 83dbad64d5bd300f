"""interp_gpt.circuits.mib against MIB's own code (MIB-circuit-track b759df3 on the EAP-IG code at 7af394a),
through the numbers and files it wrote in tests/data/mib/ (bench/mib_reference.py ran it offline; its
docstring has the recipe). Nothing here imports MIB: the data is what its code produced.

- Their graph files (`to_json`, `to_pt`; edge and node scores, EAP and EAP-IG) read here and score the
  same faithfulness, CPR and CMD as their `evaluate_area_under_curve`, under all four interventions, on
  the shipped tiny-gpt2 and on a random GPT-2 with GPT-2's vocabulary, with and without right-padding.
- Our graph files, scored by their code, give the numbers ours gives.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.circuits import Graph, eap_ig_scores
from interp_gpt.circuits.mib import load_mib_graph, mib_score, read_task

sys.path.insert(0, str(Path(__file__).resolve().parent))

DATA = Path(__file__).resolve().parent / "data" / "mib"
REF = json.loads((DATA / "reference.json").read_text(encoding="utf-8"))
TOL = 1e-4  # the bound on CPR / CMD; faithfulness is held to the same


@pytest.fixture(scope="module")
def models(gpt2_vocab_dir):  # type: ignore[no-untyped-def]
    from tl_gpt2 import hf_gpt2

    from interp_gpt import from_pretrained
    from interp_gpt.tokenizer import gpt2_tokenizer

    hf = hf_gpt2()
    digest = hashlib.sha256()
    for name, t in sorted(hf.state_dict().items()):
        digest.update(name.encode())  # as bench/mib_reference.py's state_sha256
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    random = from_pretrained(hf)  # processed as transformer-lens' from_pretrained processes it, as MIB loads GPT-2
    random.tokenizer = gpt2_tokenizer(gpt2_vocab_dir)
    return {"tiny-gpt2": GPT.from_pretrained("tiny-gpt2"), "random-gpt2": random.eval()}, digest.hexdigest()


CASES = [
    (model, task, e["graph"], e["intervention"], fmt)
    for model, m in REF["models"].items()
    for task, t in m["tasks"].items()
    for e in t["evaluations"]
    for fmt in ("pt", "json")
]


def _evaluation(model: str, task: str, graph: str, intervention: str) -> dict[str, Any]:
    t = REF["models"][model]["tasks"][task]
    return next(e for e in t["evaluations"] if e["graph"] == graph and e["intervention"] == intervention)


def test_the_random_model_is_the_one_their_code_ran(models):
    _, digest = models
    assert REF["models"]["random-gpt2"]["model"]["hf_state_sha256"] == digest


@pytest.mark.parametrize("model_name,task_name", [(m, t) for m in REF["models"] for t in REF["models"][m]["tasks"]])
def test_task_files_tokenize_as_their_code_tokenized_them(models, model_name, task_name):
    model = models[0][model_name]
    t = REF["models"][model_name]["tasks"][task_name]
    task = read_task(DATA / t["task_csv"], model)
    for row, n in enumerate(task.lengths.tolist()):
        assert task.clean[row, :n].tolist() == t["clean_tokens"][row][:n]
        assert task.corrupted[row, :n].tolist() == t["corrupted_tokens"][row][:n]


@pytest.mark.parametrize("model_name,task_name,graph,intervention,fmt", CASES, ids=["-".join(c) for c in CASES])
def test_their_graph_files_score_as_their_code_scores_them(models, model_name, task_name, graph, intervention, fmt):
    model = models[0][model_name]
    t = REF["models"][model_name]["tasks"][task_name]
    e = _evaluation(model_name, task_name, graph, intervention)
    task = read_task(DATA / t["task_csv"], model)
    got = mib_score(
        model, task, load_mib_graph(DATA / t["graphs"][graph][fmt], model), level=e["level"],
        intervention=intervention, absolute=e["absolute"], progress=False,
    )  # fmt: skip
    scale = max(abs(e["baseline"]), abs(e["empty"]))
    assert abs(got.full - e["baseline"]) <= TOL * scale
    assert abs(got.empty - e["empty"]) <= TOL * scale
    assert got.faithfulness.tolist() == pytest.approx(e["faithfulnesses"], abs=TOL)
    assert (got.cpr, got.cmd) == pytest.approx((e["area_under"], e["area_from_1"]), abs=TOL)
    assert got.n_items == [s["n_items"] for s in e["steps"]]


OURS = json.loads((DATA / "ours_scored_by_mib.json").read_text(encoding="utf-8"))
OUR_FILES = [k for k in OURS if k.startswith("ours_")]


@pytest.mark.parametrize("name", OUR_FILES)
def test_our_graph_files_score_in_their_code_as_in_ours(models, name):
    """The file is what save_mib_graph writes for our EAP-IG scores of the task (checked: our scores
    today equal the file's); their code's numbers for it, recorded, equal ours for every level and
    intervention."""
    model = models[0]["tiny-gpt2"]
    task = read_task(DATA / "induction_tiny-gpt2_mixed.csv", model)
    scores = eap_ig_scores(model, task.clean, task.corrupted, task.metric, steps=5, progress=False)
    loaded = load_mib_graph(DATA / name, model)
    assert loaded.edge_scores is not None and loaded.node_scores is not None
    torch.testing.assert_close(loaded.edge_scores, scores, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(loaded.node_scores, Graph.from_model(model).node_scores(scores), rtol=1e-4, atol=1e-6)
    for e in OURS[name]:
        got = mib_score(model, task, loaded, level=e["level"], intervention=e["intervention"], progress=False)
        assert got.faithfulness.tolist() == pytest.approx(e["faithfulnesses"], abs=TOL), (e["level"], e["intervention"])
        assert (got.cpr, got.cmd) == pytest.approx((e["area_under"], e["area_from_1"]), abs=TOL)
