"""The circuit page (`plots.circuit_page` saved with `save_html`) in headless Chromium, networking
off, driven as tests/test_viewer_browser.py drives the attention viewer: it loads with no error
and no request, draws the circuit's edges and the faithfulness curve, and hovering an edge's
middle names the edge and its score."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from interp_gpt import Config
from interp_gpt.circuits import Circuit, Graph, faithfulness_curve
from interp_gpt.plots import circuit_page, save_html

sys.path.insert(0, str(Path(__file__).resolve().parent))
from circuit_refs import random_model  # noqa: E402
from test_viewer_browser import CHROMIUM, PLOT, DevTools, colour_stats  # noqa: E402

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found on PATH (Debian: apt-get install -y chromium; or set INTERP_GPT_CHROMIUM)",
)

TWO = Config(n_layers=2, d_model=36, n_heads=3, d_vocab=60, n_ctx=16)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    devtools = DevTools(width=1100, height=1300)
    try:
        yield devtools
    finally:
        devtools.close()


def test_circuit_page_in_headless_chromium(browser: DevTools, tmp_path: Path) -> None:
    model = random_model(TWO, seed=3)
    gen = torch.Generator().manual_seed(0)
    clean, corrupted = (torch.randint(0, TWO.d_vocab, (2, 6), generator=gen) for _ in range(2))
    g = Graph(TWO)
    scores = torch.randn(g.n_edges, generator=gen)
    curve = faithfulness_curve(model, clean, corrupted, scores, metric, [0, 5, 20, g.n_edges], progress=False)
    circuit = Circuit.top_k(g, scores, 12)
    page = save_html(circuit_page(circuit, {"random <b>scores</b>": curve}), tmp_path / "circuit.html")
    url = page.resolve().as_uri()

    browser.page("Page.navigate", {"url": url})
    browser.wait_for(
        f"document.readyState === 'complete' && {PLOT} && document.querySelectorAll('.scatterlayer .trace').length > 0"
    )
    browser.settle(0.5)

    # Every kept edge is a trace named by its edge; the curve is there with the values computed.
    metas = browser.js(f"{PLOT}.data.filter(t => t.meta).map(t => t.meta)")
    assert sorted(metas) == sorted(circuit.edges)
    ys = browser.js(f"Array.from({PLOT}.data.find(t => t.mode === 'lines+markers').y)")
    assert torch.allclose(torch.tensor(ys, dtype=torch.float64), curve.faithfulness.double(), atol=1e-6)
    # The label is text, not markup: no <b> element anywhere in the page.
    assert browser.js("document.querySelectorAll('b, img, svg script').length") == 0
    shot = browser.screenshot(".js-plotly-plot")
    inked, _ = colour_stats(shot)
    assert inked > 0.03, f"the page looks blank: {inked:.1%} inked"

    # Hover the middle of the widest edge: its name and score show.
    widest = max(range(len(metas)), key=lambda i: abs(float(scores[g.edge_index(metas[i])])))
    name = metas[widest]
    x, y = browser.js(
        f"""(() => {{
            const gd = {PLOT}; const t = gd.data.find(t => t.meta === {name!r});
            const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
            const r = gd.querySelector('.nsewdrag').getBoundingClientRect();
            return [r.left + xa.l2p(t.x[1]), r.top + ya.l2p(t.y[1])];
        }})()"""
    )
    browser.hover(x, y)
    hover = browser.wait_for("document.querySelector('.hoverlayer .hovertext')?.textContent")
    assert name in hover and f"score {float(scores[g.edge_index(name)]):.4g}" in hover, hover

    browser.settle(0.3)
    assert browser.problems() == []
    others = [u for u in browser.requests() if u != url and not u.startswith(("data:", "blob:"))]
    assert others == [], f"the page made network requests: {others}"
