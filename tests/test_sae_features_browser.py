"""The SAE feature page in headless Chromium (networking off): it draws both plots, shows hostile token
text as text, shades the contexts, and makes no request. Uses the attention viewer test's DevTools driver;
skips (with its reason) where Chromium is absent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_viewer_browser import CHROMIUM, DevTools, colour_stats

from interp_gpt.loading import from_pretrained
from interp_gpt.sae import SAE, SAEConfig
from interp_gpt.sae.features import feature_page, feature_report

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found on PATH (Debian: apt-get install -y chromium; or set INTERP_GPT_CHROMIUM)",
)
HOSTILE = ["<script>alert(1)</script>", '<img src=x onerror="alert(2)">', "<b>bold</b>", "&amp;"]


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    devtools = DevTools()
    try:
        yield devtools
    finally:
        devtools.close()


def test_feature_page_in_headless_chromium(browser: DevTools, tmp_path: Path) -> None:
    model = from_pretrained("tiny-gpt2")
    sae = SAE(SAEConfig(d_in=128, d_sae=32, metadata={"hook_name": "blocks.1.hook_resid_pre"}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(sae.W_enc.shape, generator=g) * 0.3)
        sae.W_dec.copy_(torch.randn(sae.W_dec.shape, generator=g) * 0.3)
    tokens = model.to_tokens("The king and the queen walked out; then the king spoke to the people of the town.")
    report = feature_report(model, sae, tokens, 3, n_contexts=3, before=4, after=2)
    assert len(report.contexts) == 3
    ctx = report.contexts[0]
    ctx["tokens"] = HOSTILE + ctx["tokens"]  # markup-looking token text must stay text
    ctx["acts"] = [0.0] * len(HOSTILE) + ctx["acts"]
    ctx["pos"] += len(HOSTILE)
    url = feature_page(report, tmp_path / "feature.html").resolve().as_uri()

    browser.page("Page.navigate", {"url": url})
    browser.wait_for(
        "document.readyState === 'complete' && document.querySelectorAll('.js-plotly-plot').length === 2"
        " && document.querySelectorAll('.js-plotly-plot .bars path, .js-plotly-plot .point path').length > 0"
    )
    browser.settle(0.5)
    shown = browser.js(
        "[...document.querySelectorAll('#contexts .ctx')[0].querySelectorAll('.tok')].map(e => e.textContent)"
    )
    assert shown[: len(HOSTILE)] == [h.replace(" ", "␣") for h in HOSTILE]
    assert browser.js("document.querySelectorAll('#contexts img, #contexts b, #contexts script').length") == 0
    assert browser.js("document.querySelectorAll('#contexts .ctx').length") == 3
    # the top token is outlined, its value in its tooltip
    titles = browser.js(
        "[...document.querySelectorAll('#contexts .ctx')[1].querySelectorAll('.tok')].map(e => e.title)"
    )
    c1 = report.contexts[1]
    assert titles[c1["pos"]].endswith(f": {c1['max_act']:.3f}")
    inked, _ = colour_stats(browser.screenshot("#contexts"))
    assert inked > 0.02, "the contexts look blank"
    for plot in ("#histogram", "#logits"):
        assert colour_stats(browser.screenshot(plot))[0] > 0.02, f"{plot} looks blank"
    browser.settle(0.3)
    assert browser.problems() == []
    others = [u for u in browser.requests() if u != url and not u.startswith(("data:", "blob:"))]
    assert others == [], f"the page made network requests: {others}"
