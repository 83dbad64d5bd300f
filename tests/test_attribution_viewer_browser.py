"""The attribution graph page (`graph_page`) in headless Chromium, networking off, driven as
tests/test_viewer_browser.py drives the attention viewer (real mouse and key events over DevTools):
it draws prune_graph's nodes and edges, the sliders redraw what prune_graph keeps at their values,
hovering and clicking a node shows its details and pins it, hostile token text stays text, no request
leaves the page, and supernodes survive a reload and travel as a JSON file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import GPT
from interp_gpt.attribution import attribute, graph_page
from interp_gpt.attribution.viewer import page_data, render_page
from interp_gpt.files import write_atomic
from interp_gpt.sae.training import shipped_transcoders, split_corpus, token_windows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attribution_viewer import PROMPT, pruned_sets  # noqa: E402
from test_viewer_browser import CHROMIUM, HOSTILE, DevTools  # noqa: E402

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found on PATH (Debian: apt-get install -y chromium; or set INTERP_GPT_CHROMIUM)",
)
REPO = Path(__file__).resolve().parents[1]
READY = "document.readyState === 'complete' && !!window.attributionGraph && !!document.querySelector('#graph .node')"
DRAWN_NODES = "[...document.querySelectorAll('#graph .node')].map(g => g.getAttribute('data-id'))"
DRAWN_EDGES = "[...document.querySelectorAll('#graph .edge')].map(p => [p.getAttribute('data-source'), p.getAttribute('data-target')])"


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return GPT.from_pretrained("tiny-gpt2")


@pytest.fixture(scope="module")
def tcs(model):
    return shipped_transcoders(model)


@pytest.fixture(scope="module")
def graph(model, tcs):
    return attribute(model, PROMPT, tcs)


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    devtools = DevTools(width=1500, height=1000)
    try:
        yield devtools
    finally:
        devtools.close()


def reload(browser: DevTools, restored: str = "true") -> None:
    """Reload the page and wait for the new document. Page.reload returns before the old document is
    gone, so READY alone may still read the old page (a race seen once under load): a marker set on the
    old window tells the two apart.

    `restored`: a condition on the new page that what the old one stored came back. A page writes
    localStorage through its own renderer, which hands the write to the browser asynchronously; under
    load a reload straight after the write can read the value from before it (seen in a CI run). So up
    to three reloads, a second apart, until the condition holds; the caller's assert then tells a page
    that never restores (the behaviour under test) from one that was only early."""
    for attempt in range(3):
        browser.settle(0.2 + attempt)
        browser.js("window.__before_reload = true")
        browser.page("Page.reload")
        browser.wait_for(f"!window.__before_reload && {READY}")
        if browser.js(restored):
            return


def open_page(browser: DevTools, page: Path) -> str:
    url = page.resolve().as_uri()
    browser.page("Page.navigate", {"url": url})
    browser.wait_for(READY)
    browser.settle(0.3)
    return url


def centre(browser: DevTools, selector: str) -> tuple[float, float]:
    """The middle of the element `selector` picks, scrolled into view first."""
    return browser.js(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center', inline: 'center'}});"
        " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )


def drawn(browser: DevTools) -> tuple[set[str], set[tuple[str, str]]]:
    nodes, edges = browser.js(DRAWN_NODES), browser.js(DRAWN_EDGES)
    assert len(nodes) == len(set(nodes)) and len(edges) == len(set(map(tuple, edges)))  # each drawn once
    return set(nodes), {tuple(e) for e in edges}


def no_trouble(browser: DevTools, *urls: str) -> None:
    """No JavaScript error, no dialog, and no request but for the pages themselves."""
    browser.settle(0.3)
    assert browser.problems() == []
    others = [u for u in browser.requests() if u not in urls and not u.startswith(("data:", "blob:"))]
    assert others == [], f"the page made network requests: {others}"


def test_the_page_draws_prunes_and_shows_a_node(browser, graph, model, tcs, tmp_path):
    windows = token_windows(model, split_corpus(REPO / "data" / "corpus")[1], context_size=32, max_windows=8)
    page = graph_page(graph, tmp_path / "graph.html", model=model, transcoders=tcs, contexts=windows)
    url = open_page(browser, page)

    # At the first thresholds: prune_graph's nodes and edges, each drawn once, and the counts say so.
    want = pruned_sets(graph, model, 0.8, 0.98)
    assert drawn(browser) == want
    assert browser.js("document.getElementById('counts').textContent").startswith(f"{len(want[0])} of ")
    # The page's rule at other thresholds too (without drawing).
    for nt, et in ((0.5, 0.9), (0.9, 0.8), (0.99, 0.7), (0.9, 0.99), (0.99, 0.999)):  # 0.9/0.8, 0.99/0.7: clean-up
        got = browser.js(f"attributionGraph.prune({nt}, {et})")
        assert ({*got["nodes"]}, {tuple(e) for e in got["edges"]}) == pruned_sets(graph, model, nt, et), (nt, et)

    # Move the node slider: the drawing is prune_graph's at the new threshold.
    browser.js(
        "(() => { const s = document.getElementById('node-threshold'); s.value = '0.6';"
        " s.dispatchEvent(new Event('input', {bubbles: true})); })()"
    )
    smaller = pruned_sets(graph, model, 0.6, 0.98)
    assert drawn(browser) == smaller and smaller[0] < want[0]
    # The edge slider with the keyboard, like a person: 40 steps of 0.001 down.
    browser.click(*centre(browser, "#edge-threshold"))
    for _ in range(40):
        for kind in ("keyDown", "keyUp"):
            browser.page(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": "ArrowLeft", "code": "ArrowLeft", "windowsVirtualKeyCode": 37},
            )
    nt, et = browser.js("attributionGraph.thresholds()")
    assert nt == 0.6 and et < 0.95
    assert drawn(browser) == pruned_sets(graph, model, nt, et)
    assert browser.js("document.getElementById('edge-threshold-value').textContent") == f"{et:.3f}"

    # Back to the first thresholds; hover the most influential feature: its details show.
    browser.js(
        "(() => { for (const [id, v] of [['node-threshold', '0.8'], ['edge-threshold', '0.98']]) {"
        " const s = document.getElementById(id); s.value = v; s.dispatchEvent(new Event('input', {bubbles: true})); } })()"
    )
    data = browser.js("attributionGraph.data")
    features = [n for n in data["nodes"] if n["kind"] == "feature" and n["id"] in want[0]]
    node = min(features, key=lambda n: n["cumulative"])
    selector = f'#graph .node[data-id="{node["id"]}"]'
    browser.hover(*centre(browser, selector))
    fields = browser.js(
        "Object.fromEntries([...document.querySelectorAll('#details tr')].map(r => [r.dataset.field, r.cells[1].textContent]))"
    )
    assert (
        fields["kind"] == "feature"
        and fields["layer"] == str(node["layer"])
        and fields["feature"] == str(node["feature"])
    )
    assert fields["position"].startswith(f"{node['pos']} (") and fields["drawn"] == "yes"
    assert abs(float(fields["activation"]) - node["activation"]) < 1e-4
    assert browser.js("document.querySelector('#details h3').textContent").startswith(
        f"L{node['layer']} #{node['feature']} @{node['pos']}"
    )
    inputs = browser.js(
        "[...document.querySelectorAll('#details .edge-list')[0].querySelectorAll('li')].map(li => li.dataset.id)"
    )
    outputs = browser.js(
        "[...document.querySelectorAll('#details .edge-list')[1].querySelectorAll('li')].map(li => li.dataset.id)"
    )
    assert inputs and outputs and set(outputs) & want[0]
    first_promoted = browser.js("document.querySelector('#details .tokens .tok').textContent")
    assert first_promoted == node["promoted"][0][0].replace(" ", "\u2423").replace("\n", "\u21b5")
    assert browser.js("document.querySelectorAll('#details .ctx').length") == len(node["contexts"]) > 0
    # its edges are highlighted, the others dimmed
    assert browser.js("document.getElementById('graph').classList.contains('focus')")
    lit = browser.js("[...document.querySelectorAll('#graph .edge.hi')].map(p => [p.dataset.source, p.dataset.target])")
    assert lit and all(node["id"] in e for e in lit)

    # Click it: pinned, listed, and still shown when the mouse leaves.
    browser.click(*centre(browser, selector))
    assert browser.js("[...document.querySelectorAll('#pinned li')].map(li => li.dataset.id)") == [node["id"]]
    assert browser.js(f"document.querySelector({json.dumps(selector)}).classList.contains('pinned')")
    browser.hover(2, 2)
    assert browser.js("document.querySelector('#details tr[data-field=feature] td').textContent") == str(
        node["feature"]
    )
    no_trouble(browser, url)


def test_hostile_token_text_stays_text(browser, model, tcs, tmp_path):
    prompt = '<img src=x onerror="alert(1)"><script>alert(2)</script> the cat'
    graph = attribute(model, prompt, tcs)
    data = page_data(graph, model=model, transcoders=tcs, slug=HOSTILE[0], title=HOSTILE[1])
    # and whole tokens of markup (a BPE piece rarely is), where the page shows token text
    data["tokens"] = [HOSTILE[i % 2] if i else t for i, t in enumerate(data["tokens"])]
    data["tokens"][2] = '<img src=x onerror="window.__hostile = 1"><svg onload="window.__hostile = 2">'  # no dialog
    for node in data["nodes"]:
        if node["kind"] == "embedding":
            node["token"] = data["tokens"][node["pos"]]
        elif node["kind"] == "logit":
            node["token"] = HOSTILE[1]
        elif node.get("promoted"):
            node["promoted"][0][0] = HOSTILE[0]
    page = write_atomic(tmp_path / "hostile.html", render_page(data))
    url = open_page(browser, page)

    assert browser.js("document.getElementById('title').textContent") == HOSTILE[1]
    assert browser.js("document.getElementById('prompt').textContent") == graph.input_string
    assert browser.js("document.title") == f"{HOSTILE[1]}: {HOSTILE[0]}"
    token = "#graph .node.kind-embedding[data-id^='E_'][data-id$='_1']"
    browser.hover(*centre(browser, token))
    assert (
        browser.js("document.querySelector('#details h3').textContent")
        == f"emb {HOSTILE[1].replace(' ', chr(0x2423))} @1"
    )
    logit = browser.js("document.querySelector('#graph .logit-label').textContent")
    assert logit == HOSTILE[1].replace(" ", "\u2423")
    feature = "#graph .node.kind-feature"
    browser.hover(*centre(browser, feature))
    browser.hover(*centre(browser, token))
    # nothing of it became an element; no script ran (no dialog, no error)
    assert browser.js("document.querySelectorAll('img, b, iframe, svg script, object, embed').length") == 0
    assert browser.js("document.scripts.length") == 2
    assert browser.js("window.__hostile === undefined")  # no handler ran
    label = browser.js("document.querySelector('#graph .token-label[data-pos=\"2\"] title').textContent")
    assert label == f"position 2: {json.dumps(data['tokens'][2])}"
    no_trouble(browser, url)


def test_supernodes_survive_a_reload_and_travel_as_json(browser, graph, model, tcs, tmp_path):
    page = graph_page(graph, tmp_path / "graph.html", model=model, slug="cat-mat")
    url = open_page(browser, page)
    ids = browser.js("[...document.querySelectorAll('#graph .node.kind-feature')].slice(0, 2).map(g => g.dataset.id)")
    for node_id in ids:
        browser.click(*centre(browser, f'#graph .node[data-id="{node_id}"]'))
    assert browser.js("[...document.querySelectorAll('#pinned li')].map(li => li.dataset.id)") == ids
    name = "<b>cat</b> features"
    browser.js(f"document.getElementById('group-name').value = {json.dumps(name)}")
    browser.click(*centre(browser, "#group"))
    expected = {"schema": 1, "slug": "cat-mat", "pinned": [], "supernodes": [{"name": name, "members": ids}]}
    assert browser.js("attributionGraph.grouping()") == expected
    assert browser.js("document.querySelector('#supernodes .name').textContent") == name
    assert browser.js("document.querySelector('#graph .supernode').dataset.name") == name
    assert browser.js("document.querySelector('#graph .supernode text').textContent") == name
    assert browser.js("document.querySelectorAll('b').length") == 0

    # Saved under the slug: a reload brings it back.
    stored = browser.js("localStorage.getItem('interp_gpt.attribution_graph.cat-mat')")
    assert json.loads(stored) == expected
    reload(browser, "attributionGraph.grouping().supernodes.length === 1")
    assert browser.js("attributionGraph.grouping()") == expected
    assert browser.js("document.querySelectorAll('#graph .supernode').length") == 1

    # Another graph's page (another slug) does not see it.
    other = graph_page(graph, tmp_path / "other.html", model=model, slug="other-graph")
    other_url = open_page(browser, other)
    assert browser.js("attributionGraph.grouping()")["supernodes"] == []

    # Upload a grouping file (a download's JSON, edited): applied, unknown ids left out, saved.
    upload = tmp_path / "grouping.json"
    upload.write_text(json.dumps({"supernodes": [{"name": "uploaded", "members": [ids[0], "no_such_node"]}]}))
    document = browser.page("DOM.getDocument")["root"]["nodeId"]
    field = browser.page("DOM.querySelector", {"nodeId": document, "selector": "#upload"})["nodeId"]
    browser.page("DOM.setFileInputFiles", {"files": [str(upload)], "nodeId": field})
    browser.wait_for("document.getElementById('grouping-status').textContent.startsWith('loaded')")
    assert browser.js("document.getElementById('grouping-status').textContent") == (
        "loaded 1 supernodes; 1 node ids not in this graph left out"
    )
    assert browser.js("attributionGraph.grouping()")["supernodes"] == [{"name": "uploaded", "members": [ids[0]]}]
    assert browser.js("attributionGraph.importGrouping('not json')") is False
    assert browser.js("document.getElementById('grouping-status').textContent").startswith("not a grouping file:")
    reload(browser, "attributionGraph.grouping().supernodes[0]?.name === 'uploaded'")
    assert browser.js("attributionGraph.grouping()")["supernodes"] == [{"name": "uploaded", "members": [ids[0]]}]
    no_trouble(browser, url, other_url)
