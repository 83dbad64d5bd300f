"""`interp-gpt attribute`: tiny-gpt2 with its shipped transcoders (per-layer, cross-layer, and a saved
folder), the page and the graph JSON it writes checked against the library's own answers, and every
bad input one line on stderr with exit status 2, naming the value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.attribution import attribute, prune_graph
from interp_gpt.cli import build_parser, main
from interp_gpt.sae.training import shipped_transcoders
from interp_gpt.sae.transcoders.config import TranscoderConfig
from interp_gpt.sae.transcoders.transcoder import Transcoder, save_transcoders

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The cat sat on the mat because"


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return GPT.from_pretrained("tiny-gpt2")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["attribute", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def page_data(path: Path) -> dict:
    """The data block of a graph page, parsed."""
    text = path.read_text(encoding="utf-8")
    block = re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', text, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_attribute_writes_the_page_and_the_graph_json(capsys, model, tmp_path):
    rc, out, err = run(
        capsys,
        "tiny-gpt2",
        PROMPT,
        "--transcoders",
        "shipped",
        "--out",
        tmp_path / "g.html",
        "--json",
        tmp_path / "g.json",
    )
    assert (rc, err) == (0, "")
    graph = attribute(model, PROMPT, shipped_transcoders(model))
    node_mask, edge_mask, _ = prune_graph(graph)
    assert (
        f"{graph.n_features} feature nodes" in out
        and f"{int(node_mask.sum())} nodes, {int(edge_mask.sum())} edges" in out
    )
    assert f"wrote {tmp_path / 'g.html'}" in out and f"wrote {tmp_path / 'g.json'}" in out
    data = page_data(tmp_path / "g.html")
    assert data["prompt"] == graph.input_string and data["scan"] == "tiny-gpt2-transcoders"
    assert (data["node_threshold"], data["edge_threshold"]) == (0.8, 0.98)
    assert any("promoted" in n for n in data["nodes"]) and not any("contexts" in n for n in data["nodes"])
    written = json.loads((tmp_path / "g.json").read_text(encoding="utf-8"))
    assert written["metadata"]["slug"] == data["slug"] and written["metadata"]["scan"] == "tiny-gpt2-transcoders"
    assert {n["node_id"] for n in written["nodes"]} <= {n["id"] for n in data["nodes"]}
    assert len(written["links"]) == int(edge_mask.sum())


def test_attribute_with_a_clt_contexts_and_options(capsys, model, tmp_path):
    rc, out, err = run(
        capsys, "tiny-gpt2", PROMPT, "--transcoders", "shipped-clt", "--out", tmp_path / "clt.html",
        "--contexts-from", REPO / "data" / "corpus", "--max-windows", 4, "--max-feature-nodes", 40,
        "--node-threshold", 0.7, "--edge-threshold", 0.95, "--slug", "clt-cat", "--batch-size", 16,
    )  # fmt: skip
    assert (rc, err) == (0, ""), err
    assert "40 feature nodes" in out and "pruned at 0.7 / 0.95" in out
    data = page_data(tmp_path / "clt.html")
    assert data["slug"] == "clt-cat" and (data["node_threshold"], data["edge_threshold"]) == (0.7, 0.95)
    assert data["scan"] == "tiny-gpt2-clt"
    features = [n for n in data["nodes"] if n["kind"] == "feature"]
    assert features and all("contexts" in n and "promoted" in n for n in features)
    assert any(n["contexts"] for n in features)


def test_attribute_reads_a_saved_transcoder_folder(capsys, model, tmp_path):
    folder = save_transcoders(shipped_transcoders(model), tmp_path / "my-transcoders", format="circuit-tracer")
    rc, out, err = run(capsys, "tiny-gpt2", "Hello there", "--transcoders", folder, "--out", tmp_path / "g.html")
    assert (rc, err) == (0, ""), err
    assert page_data(tmp_path / "g.html")["scan"] == "my-transcoders"


def test_bad_inputs_are_one_line_naming_the_value(capsys, tmp_path):
    narrow = [
        Transcoder(TranscoderConfig(d_in=64, d_sae=32, d_out=64, skip=True, metadata={
            "hook_name": f"blocks.{layer}.ln2.hook_normalized", "hook_name_out": f"blocks.{layer}.hook_mlp_out"}))
        for layer in range(2)
    ]  # fmt: skip
    save_transcoders(narrow, tmp_path / "narrow")
    page = tmp_path / "g.html"
    missing = tmp_path / "missing"
    cases = [
        (["--transcoders", missing], rf"--transcoders '{re.escape(str(missing))}': no such file or folder"),
        (["--transcoders", tmp_path / "narrow"], r"--transcoders '.*narrow': .*d_in=64 does not fit 'blocks.0.ln2.hook_normalized', which is d_model=128 wide"),
        (["--transcoders", REPO / "data"], r"--transcoders '.*data': load_transcoders: .* holds no cfg.json"),
        (["--transcoders", "shipped", "--node-threshold", "1.5"], r"--node-threshold=1.5 is out of range"),
        (["--transcoders", "shipped", "--edge-threshold", "1"], r"--edge-threshold=1.0 is out of range: .*<= 0.999"),
        (["--transcoders", "shipped", "--max-feature-nodes", "0"], r"--max-feature-nodes=0 is out of range"),
        (["--transcoders", "shipped", "--max-nodes", "-3"], r"--max-nodes=-3 is out of range"),
        (["--transcoders", "shipped", "--contexts-from", missing], r"--contexts-from '.*missing': no such file or folder"),
    ]  # fmt: skip
    for extra, message in cases:
        rc, out, err = run(capsys, "tiny-gpt2", PROMPT, "--out", page, *extra)
        assert rc == 2 and out == "", (extra, out)
        assert err.count("\n") == 1 and err.endswith("\n") and re.match(rf"error: {message}", err), err
    rc, _, err = run(capsys, "tiny-gpt2", "", "--transcoders", "shipped", "--out", page)
    assert rc == 2 and err == "error: PROMPT is empty; give some text, e.g. 'The cat sat on the mat because'\n"
    rc, _, err = run(capsys, "tiny-gpt2", PROMPT, "--transcoders", "shipped", "--out", tmp_path)
    assert rc == 2 and err == f"error: --out '{tmp_path}' is a folder; expected a file path\n"
    rc, _, err = run(capsys, "no-such-model", PROMPT, "--transcoders", "shipped", "--out", page)
    assert rc == 2 and "no-such-model" in err and err.count("\n") == 1
    rc, _, err = run(capsys, "tiny-gpt2", PROMPT, "--out", page)  # --transcoders is required
    assert rc == 2 and "--transcoders" in err
    assert not page.exists()


def test_attribute_is_listed_with_its_help(capsys):
    assert main(["--help"]) == 0
    assert "attribute" in capsys.readouterr().out
    assert main(["attribute", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--transcoders", "--out", "--json", "--max-feature-nodes", "--node-threshold", "--edge-threshold",
                   "--batch-size", "--contexts-from"):  # fmt: skip
        assert option in text
    args = build_parser().parse_args(["attribute", "gpt2", "hi", "--transcoders", "shipped", "--out", "g.html"])
    assert (args.model, args.prompt, args.json, args.max_feature_nodes) == ("gpt2", "hi", None, None)


def test_the_readme_command_runs_as_written(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The README's `interp-gpt attribute ...` line (under "Attribution graphs"), run in a fresh folder."""
    import shlex

    text = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Attribution graphs\n", 1)[1]
    line = next(ln for ln in text.split("\n## ", 1)[0].splitlines() if ln.startswith("interp-gpt attribute "))
    argv = shlex.split(line)[1:]
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "graph.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert json.loads((tmp_path / "graph.json").read_text(encoding="utf-8"))["nodes"]
