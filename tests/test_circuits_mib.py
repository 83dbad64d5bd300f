"""interp_gpt.circuits.mib: MIB's graph files both ways (against the EAP-IG layout written out here from
its definitions), its metrics (each intervention against tests/circuit_refs.py's brute-force patching
with MIB's node values built here from its definitions), tasks from files and templates, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT, Config
from interp_gpt.circuits import Circuit, Graph, eap_scores
from interp_gpt.circuits.mib import (
    MIB_INTERVENTIONS,
    MIB_PERCENTAGES,
    Task,
    area_under_curve,
    check_mib_submission,
    induction_task,
    load_mib_graph,
    mib_random_baseline,
    mib_score,
    name_mover_task,
    read_task,
    save_mib_circuits,
    save_mib_graph,
    write_mib_submission,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import brute_patch, random_model, sender_values  # noqa: E402

CFG = Config(n_layers=2, d_model=36, n_heads=3, d_vocab=60, n_ctx=16)


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    model = random_model(CFG, seed=3)
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, CFG.d_vocab, (4, 7), generator=gen)
    corrupted = torch.randint(0, CFG.d_vocab, (4, 7), generator=gen)
    lengths = torch.tensor([7, 5, 6, 7])  # right-padded rows: the metric reads each row's last real token
    answers = torch.randint(0, CFG.d_vocab, (4, 2), generator=gen)
    task = Task("random", clean, corrupted, lengths, answers)
    scores = eap_scores(model, clean, corrupted, task.metric)
    return model, task, scores


@pytest.fixture(scope="module")
def tiny() -> GPT:
    return GPT.from_pretrained("tiny-gpt2")


# ----------------------------------------------------------------------------
# the file format
# ----------------------------------------------------------------------------
def eap_ig_backward_index(cfg: Config, receiver: str) -> int:
    """The EAP-IG code's column of a receiver: per layer every head's q, then k, then v, then the MLP."""
    if receiver == "logits":
        return cfg.n_layers * (3 * cfg.n_heads + 1)
    if receiver.startswith("m"):
        layer = int(receiver[1:])
        return layer * (3 * cfg.n_heads + 1) + 3 * cfg.n_heads
    node, qkv = receiver[:-3], receiver[-2]
    layer, head = (int(x[1:]) for x in node.split("."))
    return layer * (3 * cfg.n_heads + 1) + "qkv".index(qkv) * cfg.n_heads + head


def test_pt_file_lays_edges_out_as_the_eap_ig_code_does(setup, tmp_path):
    model, _, scores = setup
    g = Graph(CFG)
    save_mib_graph(tmp_path / "g.pt", model, scores, circuit=Circuit.top_k(g, scores, 20))
    d = torch.load(tmp_path / "g.pt", weights_only=True)
    assert d["cfg"] == {"n_layers": 2, "n_heads": 3, "parallel_attn_mlp": False, "d_model": 36}
    assert d["edges_scores"].shape == (1 + 2 * 4, 2 * 10 + 1)
    for i in (0, 5, 17, g.n_edges - 1, g.edge_index("a0.h2 -> a1.h1<k>"), g.edge_index("a1.h0 -> m1")):
        sender, receiver = g.edge_name(i).split(" -> ")
        col = eap_ig_backward_index(CFG, receiver)
        assert d["dst_nodes"][col] == receiver
        assert d["edges_scores"][g.senders.index(sender), col] == scores[i]
    assert int(d["edges_in_graph"].sum()) == Circuit.top_k(g, scores, 20).pruned().n_edges
    # no score where there is no edge (m1 does not feed a0.h0)
    assert d["edges_scores"][g.sender_index("m1"), eap_ig_backward_index(CFG, "a0.h0<q>")] == 0


def test_json_names_edges_as_the_eap_ig_code_does(setup, tmp_path):
    model, _, scores = setup
    save_mib_graph(tmp_path / "g.json", model, scores)
    d = json.loads((tmp_path / "g.json").read_text())
    assert set(d) == {"cfg", "nodes", "edges"}
    g = Graph(CFG)
    assert len(d["edges"]) == g.n_edges
    i = g.edge_index("a0.h2 -> a1.h1<k>")
    assert d["edges"]["a0.h2->a1.h1<k>"] == {"score": pytest.approx(float(scores[i])), "in_graph": False}
    assert set(d["nodes"]) == set(g.senders) | {"logits"}


@pytest.mark.parametrize("suffix", [".json", ".pt"])
def test_files_round_trip(setup, tmp_path, suffix):
    model, _, scores = setup
    g = Graph(CFG)
    nodes = g.node_scores(scores)
    circuit = Circuit.top_k(g, scores, 30)
    save_mib_graph(tmp_path / f"g{suffix}", model, scores, circuit=circuit, node_scores=nodes)
    back = load_mib_graph(tmp_path / f"g{suffix}", model)
    assert back.edge_scores is not None and back.node_scores is not None
    torch.testing.assert_close(back.edge_scores, scores.float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(back.node_scores, nodes.float(), rtol=1e-6, atol=0)
    assert torch.equal(back.in_graph, circuit.pruned().mask)
    assert back.circuit.n_edges == circuit.pruned().n_edges


def test_node_scores_sum_each_senders_edges():
    g = Graph(CFG)
    s = torch.arange(g.n_edges, dtype=torch.float64)
    want = torch.zeros(len(g.senders), dtype=torch.float64)
    for i in range(g.n_edges):
        want[g.sender_index(g.edge_name(i).split(" -> ")[0])] += s[i]
    assert torch.equal(g.node_scores(s), want)


def test_a_file_of_another_model_or_with_unknown_edges_is_refused(setup, tmp_path):
    model, _, scores = setup
    save_mib_graph(tmp_path / "g.json", model, scores)
    other = random_model(Config(n_layers=3, d_model=36, n_heads=3, d_vocab=60, n_ctx=16))
    with pytest.raises(ValueError, match="another model: its cfg has n_layers=2"):
        load_mib_graph(tmp_path / "g.json", other)
    d = json.loads((tmp_path / "g.json").read_text())
    d["edges"]["a0.h7->a1.h1<k>"] = {"score": 1.0, "in_graph": False}
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(KeyError, match="names edge 'a0.h7->a1.h1<k>'"):
        load_mib_graph(tmp_path / "bad.json", model)
    d = json.loads((tmp_path / "g.json").read_text())
    del d["edges"]["input->a0.h0<q>"]
    (tmp_path / "short.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="missing e.g."):
        load_mib_graph(tmp_path / "short.json", model)
    with pytest.raises(ValueError, match="must end in .json or .pt"):
        save_mib_graph(tmp_path / "g.safetensors", model, scores)
    save_mib_graph(tmp_path / "g.pt", model, scores)
    with pytest.raises(ValueError, match="n_layers=2"):
        load_mib_graph(tmp_path / "g.pt", other)


def test_nine_circuits_and_the_submission_check(setup, tmp_path):
    model, _, scores = setup
    paths = save_mib_circuits(tmp_path / "sub" / "ioi_gpt2", model, scores)
    assert [p.name for p in paths][:2] == ["circuit_0.001.json", "circuit_0.002.json"] and len(paths) == 9
    n = Graph(CFG).n_edges
    sizes = [int(load_mib_graph(p, model).in_graph.sum()) for p in paths]
    assert all(s <= pct * n for s, pct in zip(sizes, MIB_PERCENTAGES, strict=False))
    assert sizes[-1] > 0
    problems = check_mib_submission(tmp_path / "sub", model)
    assert any("at least 2 models" in p for p in problems) and any("at least 2 tasks" in p for p in problems)
    write_mib_submission(tmp_path / "sub2", {"ioi_gpt2": (model, scores), "mcqa_gpt2": (model, scores)})
    assert (tmp_path / "sub2" / "ioi_gpt2" / "importances.json").is_file()
    problems = check_mib_submission(tmp_path / "sub2", model)
    assert problems == ["MIB asks for circuits of at least 2 models; the folder has 1 (gpt2)"]
    (tmp_path / "sub2" / "ioi_gpt3").mkdir()
    assert any("'ioi_gpt3' is not" in p for p in check_mib_submission(tmp_path / "sub2", model))
    with pytest.raises(ValueError, match="'ioi-gpt2' is not"):
        write_mib_submission(tmp_path / "sub3", {"ioi-gpt2": (model, scores)})
    assert not (tmp_path / "sub3").exists()


# ----------------------------------------------------------------------------
# the metrics, against brute-force patching with MIB's node values
# ----------------------------------------------------------------------------
def masked_sender_values(model: GPT, task: Task) -> dict[str, torch.Tensor]:
    """circuit_refs.sender_values of the task's clean prompts run with their attention mask (pads take no
    position embedding and are no key), as MIB runs its reference prompts."""
    mask = (torch.arange(task.clean.shape[1])[None, :] < task.lengths[:, None]).long()
    model.set_use_attn_result(True)
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(task.clean, attention_mask=mask)
    finally:
        model.set_use_attn_result(False)
    out = {"input": cache["blocks.0.hook_resid_pre"]}
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            out[f"a{layer}.h{h}"] = cache[f"blocks.{layer}.attn.hook_result"][:, :, h]
        out[f"m{layer}"] = cache[f"blocks.{layer}.hook_mlp_out"] - model.blocks[layer].mlp.b_out
    return out


def mib_other_values(model: GPT, task: Task, intervention: str) -> dict[str, torch.Tensor]:
    """Each sender's value outside the circuit, in circuit_refs' convention (the input with the
    positions, MLPs without b_out), from MIB's definitions: its input node is `hook_embed`, its MLP
    nodes `hook_mlp_out` (with b_out), its head nodes `hook_result`; the means over the clean prompts
    run with their attention mask."""
    if intervention == "patching":
        return sender_values(model, task.corrupted)
    clean = sender_values(model, task.clean)
    masked = masked_sender_values(model, task)
    with torch.no_grad():
        pos = model.run_with_cache(task.clean, names_filter="hook_pos_embed")[1]["hook_pos_embed"]
        mask = (torch.arange(task.clean.shape[1])[None, :] < task.lengths[:, None]).long()
        masked_pos = model.run_with_cache(task.clean, attention_mask=mask, names_filter="hook_pos_embed")[1]
    b_out = {f"m{layer}": model.blocks[layer].mlp.b_out for layer in range(model.cfg.n_layers)}

    def mib_view(values: dict[str, torch.Tensor], pos: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v - pos if k == "input" else v + b_out[k] if k in b_out else v for k, v in values.items()}

    if intervention == "zero":
        mib = {k: torch.zeros_like(v) for k, v in clean.items()}
    elif intervention == "mean-positional":
        view = mib_view(masked, masked_pos["hook_pos_embed"])
        mib = {k: v.mean(0, keepdim=True).expand_as(v) for k, v in view.items()}
    else:  # "mean": compute_mean_activations at 7af394a: last real token / length, over prompts, then over nodes
        n = len(task)
        rows = torch.arange(n)
        view = mib_view(masked, masked_pos["hook_pos_embed"])
        per_node = [(v[rows, task.lengths - 1] / task.lengths[:, None]).sum(0) / n for v in view.values()]
        one = torch.stack(per_node).mean(0)
        mib = {k: one.expand_as(v) for k, v in clean.items()}
    return {k: v + pos if k == "input" else v - b_out[k] if k in b_out else v for k, v in mib.items()}


@pytest.mark.parametrize("intervention", MIB_INTERVENTIONS)
@pytest.mark.parametrize("level", ["edge", "node"])
def test_mib_score_equals_brute_force(setup, intervention, level):
    model, task, scores = setup
    got = mib_score(model, task, scores, level=level, intervention=intervention, progress=False)
    other = mib_other_values(model, task, intervention)
    g = Graph(CFG)
    full = task.metric(brute_patch(model, task.clean, other, []))
    empty = task.metric(brute_patch(model, task.clean, other, g.edge_names))
    assert got.full == pytest.approx(float(full), rel=1e-6, abs=1e-6)
    assert got.empty == pytest.approx(float(empty), rel=1e-6, abs=1e-6)
    node_scores = g.node_scores(scores)
    n_items = len(g.senders) if level == "node" else g.n_edges
    for pct, value, k, circuit in zip(MIB_PERCENTAGES, got.metric, got.n_items, got.circuits, strict=True):
        assert k == int(pct * n_items)
        kept = set(Circuit(g, circuit).edges)
        if level == "edge":  # MIB's top k, less what its prune drops
            assert kept <= set(Circuit.top_k(g, scores, k).edges)
        else:  # every edge between kept nodes (or into the logits): MIB's prune keeps each kept node
            top = node_scores.abs().argsort(descending=True)[:k].tolist()
            names = {g.senders[i] for i in top} | {"logits"}
            assert kept == {e for e in g.edge_names if all(n.split("<")[0] in names for n in e.split(" -> "))}
        outside = [e for e in g.edge_names if e not in kept]
        want = task.metric(brute_patch(model, task.clean, other, outside))
        assert float(value) == pytest.approx(float(want), rel=1e-6, abs=1e-6)
    faith = (got.metric - got.empty) / (got.full - got.empty)
    torch.testing.assert_close(got.faithfulness, faith)
    assert got.faithfulness[-1] == pytest.approx(1.0)
    assert (got.cpr, got.cmd) == pytest.approx(area_under_curve(MIB_PERCENTAGES, faith.tolist()))


def test_an_edge_circuit_is_pruned_as_mib_prunes_it():
    """MIB's prune stops once its nodes stop changing, checked before it drops edges, and evaluate_graph
    prunes again: top edges a0.h0 -> a1.h0<q> and a1.h0 -> logits with nothing into a0.h0 leave a1.h0 ->
    logits after the first prune (a1.h0 is fed by a0.h0), nothing after the second."""
    from interp_gpt.circuits.mib.score import _Pruner

    g = Graph(CFG)
    pruner = _Pruner(g)
    mask = g.edge_mask(["a0.h0 -> a1.h0<q>", "a1.h0 -> logits"])
    assert not pruner.edges(mask).any()
    mask = g.edge_mask(["input -> a0.h0<q>", "a0.h0 -> a1.h0<q>", "a1.h0 -> logits", "a0.h1 -> m1"])
    assert Circuit(g, pruner.edges(mask)).edges == ["input -> a0.h0<q>", "a0.h0 -> a1.h0<q>", "a1.h0 -> logits"]


def test_areas_are_trapezoids_over_the_raw_or_log_percentages():
    assert area_under_curve([0.0, 0.5, 1.0], [0.0, 0.5, 1.0]) == pytest.approx((0.5, 0.5))
    cpr, cmd = area_under_curve([0.1, 1.0], [0.2, 0.6])
    assert (cpr, cmd) == pytest.approx((0.9 * 0.4, 0.9 * 0.6))
    log_cpr, _ = area_under_curve([0.1, 1.0], [0.2, 0.6], log_scale=True)
    assert log_cpr == pytest.approx(2.302585 * 0.4, rel=1e-6)


def test_random_baseline_is_seeded_and_spread(setup):
    model, task, _ = setup
    a = mib_random_baseline(model, task, n_samples=4, seed=1, progress=False)
    b = mib_random_baseline(model, task, n_samples=4, seed=1, progress=False)
    c = mib_random_baseline(model, task, n_samples=4, seed=2, progress=False)
    assert a.cpr_mean == b.cpr_mean and a.cpr_mean != c.cpr_mean
    assert a.cpr_std > 0 and len(a.samples) == 4 and a.faithfulness_mean.shape == (10,)
    assert a.cpr_mean == pytest.approx(sum(s.cpr for s in a.samples) / 4)


def test_scoring_a_read_file_equals_scoring_the_scores(setup, tmp_path):
    model, task, scores = setup
    save_mib_graph(tmp_path / "g.pt", model, scores)
    a = mib_score(model, task, load_mib_graph(tmp_path / "g.pt", model), progress=False)
    b = mib_score(model, task, scores, progress=False)
    assert (a.cpr, a.cmd) == pytest.approx((b.cpr, b.cmd), abs=1e-6)


def test_bad_metric_input_is_refused_by_name(setup):
    model, task, scores = setup
    with pytest.raises(ValueError, match="percentages: 1.5 is out of range"):
        mib_score(model, task, scores, percentages=[0.1, 1.5], progress=False)
    with pytest.raises(ValueError, match="percentages: -0.1 is out of range"):
        mib_score(model, task, scores, percentages=[-0.1, 1.0], progress=False)
    with pytest.raises(ValueError, match="must increase"):
        mib_score(model, task, scores, percentages=[0.5, 0.1], progress=False)
    with pytest.raises(ValueError, match="intervention='mean_positional'"):
        mib_score(model, task, scores, intervention="mean_positional", progress=False)
    with pytest.raises(ValueError, match="level='edges'"):
        mib_score(model, task, scores, level="edges", progress=False)
    with pytest.raises(ValueError, match=r"edge scores \[.*got torch.float32 \(5,\)"):
        mib_score(model, task, torch.zeros(5), progress=False)
    other = random_model(Config(n_layers=3, d_model=36, n_heads=3, d_vocab=60, n_ctx=16))
    with pytest.raises(ValueError, match="edge scores"):
        mib_score(other, task, scores, progress=False)


# ----------------------------------------------------------------------------
# tasks
# ----------------------------------------------------------------------------
def test_template_tasks_separate_clean_from_corrupted_on_tiny_gpt2(tiny):
    ind = induction_task(tiny, n=8)
    assert ind.clean.shape == ind.corrupted.shape == (8, 12)
    with torch.no_grad():
        assert ind.metric(tiny(ind.clean)) > 5 > -5 > ind.metric(tiny(ind.corrupted))  # its induction heads
    nm = name_mover_task(tiny, n=8)
    for row, n in zip(nm.clean, nm.lengths.tolist(), strict=True):  # right-padded with BOS / EOS (2047)
        assert row[n - 1] != 2047 and (row[n:] == 2047).all()
    # the prompts differ in one name: B's second mention in the clean one, A in the counterfactual
    differ = nm.clean != nm.corrupted
    assert (differ.sum(1) == 1).all()
    assert torch.equal(nm.clean[differ], nm.answers[:, 1]) and torch.equal(nm.corrupted[differ], nm.answers[:, 0])


def test_read_task_reads_mibs_layouts(tiny, tmp_path):
    rows = [
        {"prompt": "When Mary and Anna met, Anna thanked", "s2_io_flip_counterfactual": {"prompt": "When Mary and Anna met, Mary thanked"},
         "metadata": {"indirect_object": "Mary", "subject": "Anna"}},
        {"prompt": "When Anna and Mary met, Mary thanked", "s2_io_flip_counterfactual": {"prompt": "When Anna and Mary met, Anna thanked"},
         "metadata": {"indirect_object": "Anna", "subject": "Mary"}},
    ]  # fmt: skip
    (tmp_path / "ioi.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    task = read_task(tmp_path / "ioi.jsonl", tiny)
    mary, anna = tiny.tokenizer.encode(" Mary")[0], tiny.tokenizer.encode(" Anna")[0]
    assert task.answers.tolist() == [[mary, anna], [anna, mary]] and len(task) == 2
    mc = [{"prompt": "Q? A. red B. blue Answer:", "choices": {"label": ["A", "B"]}, "answerKey": 1,
           "symbol_counterfactual": {"prompt": "Q? A. blue B. red Answer:", "choices": {"label": ["A", "B"]}, "answerKey": 0}}]  # fmt: skip
    (tmp_path / "mcqa.json").write_text(json.dumps(mc))
    assert read_task(tmp_path / "mcqa.json", tiny).answers.tolist() == [
        [tiny.tokenizer.encode("B")[0], tiny.tokenizer.encode("A")[0]]
    ]
    (tmp_path / "flat.csv").write_text("clean,corrupted,correct_idx,incorrect_idx\nThe cat,The dog,5,6\n")
    flat = read_task(tmp_path / "flat.csv", tiny)
    assert flat.answers.tolist() == [[5, 6]] and flat.clean[0, 0] == 2047


def test_bad_task_files_are_refused_by_name(tiny, tmp_path):
    (tmp_path / "a.csv").write_text("clean,corrupted,correct_idx\nThe cat,The dog,5\n")
    with pytest.raises(ValueError, match="row 0 has columns"):
        read_task(tmp_path / "a.csv", tiny)
    (tmp_path / "b.csv").write_text("clean,corrupted,correct_idx,incorrect_idx\nThe cat,The dog,5,6\nThe cat,,5,6\n")
    with pytest.raises(ValueError, match="row 1 lacks column 'corrupted'"):
        read_task(tmp_path / "b.csv", tiny)
    (tmp_path / "c.csv").write_text("clean,corrupted,correct_idx,incorrect_idx\nThe cat sat,The dog,5,6\n")
    with pytest.raises(ValueError, match="row 0: the clean prompt has 5 tokens, the corrupted one 4"):
        read_task(tmp_path / "c.csv", tiny)
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "a", "x_counterfactual": {"prompt": "b"}}))
    with pytest.raises(ValueError, match="row 0 has no answers"):
        read_task(tmp_path / "d.jsonl", tiny)
    with pytest.raises(ValueError, match="counterfactual='y_counterfactual' is not a column"):
        read_task(tmp_path / "d.jsonl", tiny, counterfactual="y_counterfactual")


# ----------------------------------------------------------------------------
# the commands
# ----------------------------------------------------------------------------
def test_mib_commands_score_write_and_check(tmp_path, capsys):
    from interp_gpt.cli import main

    out = tmp_path / "sub"
    assert main(["mib-score", "--task", "induction", "--n", "6", "--method", "eap", "--random", "2", "--out",
                 str(out), "--name", "ioi_gpt2"]) == 0  # fmt: skip
    report = json.loads((out / "ioi_gpt2" / "mib_score.json").read_text())
    assert report["method"] == "eap" and 0 < report["cpr"] < 1 and len(report["faithfulness"]) == 10
    assert "random" in report and "CPR" in capsys.readouterr().out
    tiny = GPT.from_pretrained("tiny-gpt2")
    assert load_mib_graph(out / "ioi_gpt2" / "importances.json", tiny).edge_scores is not None
    assert main(["mib-check", str(out)]) == 1
    assert "at least 2 models" in capsys.readouterr().out
    assert main(["mib-score", "--task", "nope", "--out", str(out)]) == 2
    assert "--task 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_relp_and_gim_track_exact_patching_of_mlp_outputs_better_than_eap(tiny, seed):
    """The issue's claim, on the one task of ours where tiny-gpt2 does the job (induction, MIB's logit
    difference): over the edges out of its two MLPs, r(RelP, exact) > r(GIM, exact) > r(EAP, exact).
    Measured r: RelP 0.993-0.998, GIM 0.927-0.936, EAP 0.822-0.899 (seeds 0-4). On the name-mover task,
    which tiny-gpt2 does not do, RelP still beats EAP but GIM does not always (bench/README.md)."""
    from interp_gpt.circuits import exact_edge_scores, gim_scores, relp_scores

    task = induction_task(tiny, n=16, seed=seed)
    g = Graph.from_model(tiny)
    mlp = torch.tensor([int(s) in (g.mlp_sender(0), g.mlp_sender(1)) for s in g.edge_sender])
    exact = exact_edge_scores(tiny, task.clean, task.corrupted, task.metric, progress=False)[mlp]

    def r(fn) -> float:  # type: ignore[no-untyped-def]
        s = fn(tiny, task.clean, task.corrupted, task.metric)[mlp]
        return float(torch.corrcoef(torch.stack([s.double(), exact.double()]))[0, 1])

    relp, gim, eap = r(relp_scores), r(gim_scores), r(eap_scores)
    assert relp > gim + 0.02 and gim > eap + 0.02, (relp, gim, eap)


def test_a_task_built_by_hand_is_checked_by_name():
    ids = torch.zeros(3, 5, dtype=torch.long)
    ok = dict(clean=ids, corrupted=ids, lengths=torch.tensor([5, 4, 3]), answers=torch.zeros(3, 2, dtype=torch.long))
    Task("t", **ok)
    with pytest.raises(ValueError, match=r"answers must be \[3, 2\]"):
        Task("t", **{**ok, "answers": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ValueError, match="corrupted has shape"):
        Task("t", **{**ok, "corrupted": torch.zeros(3, 4, dtype=torch.long)})
    with pytest.raises(ValueError, match="lengths must be"):
        Task("t", **{**ok, "lengths": torch.tensor([5, 6, 3])})
    with pytest.raises(TypeError, match="clean must be an integer tensor"):
        Task("t", **{**ok, "clean": ids.float()})
