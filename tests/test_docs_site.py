"""The documentation site: `mkdocs build --strict` passes, and the built site works with no network.

Built once into a temporary folder (the `docs` extra holds mkdocs; without it this module skips).
Then, without a browser: every public name (`interp_gpt.__all__` and each subpackage's) has its
entry in the API reference, every notebook page holds its interactive plotly figures, and no page
loads a script, style sheet, font, image or frame from another host. Then in headless Chromium
(as tests/test_viewer_browser.py drives it), served by a local `http.server`: the home page loads,
a notebook page draws an interactive plotly figure, the API page of `GPT` shows `run_with_cache`,
typing in the search box finds `run_with_cache`, and no request leaves 127.0.0.1.
"""

from __future__ import annotations

import functools
import http.server
import importlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="mkdocs is in the docs extra: pip install -e '.[docs,vocab]'")
pytest.importorskip("mkdocstrings", reason="mkdocstrings is in the docs extra: pip install -e '.[docs,vocab]'")
pytest.importorskip("mkdocs_jupyter", reason="mkdocs-jupyter is in the docs extra: pip install -e '.[docs,vocab]'")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_viewer_browser import CHROMIUM, FLAGS, DevTools  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from public_api import LAYOUT  # noqa: E402  (the house's folders, documented where users meet their names)

NOTEBOOKS = sorted(p.stem for p in (REPO / "demos").glob("*.ipynb"))
# A tag that makes the browser fetch what it names (an <a href> does not, until clicked).
FETCHING = re.compile(
    r"<(script|link|img|iframe|source|video|audio|embed)\b[^>]*\b(?:src|href)\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)",
    re.I,
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    print(f"mkdocs build --strict: {time.monotonic() - start:.1f} s")
    return out


def _public_modules() -> dict[str, list[str]]:
    found = {}
    for init in sorted((REPO / "interp_gpt").glob("**/__init__.py")):
        module = ".".join(init.parent.relative_to(REPO).parts)
        if module in LAYOUT:
            continue
        names = getattr(importlib.import_module(module), "__all__", None)
        if names is not None:
            found[module] = list(names)
    return found


def test_every_public_name_has_an_api_entry(site: Path) -> None:
    modules = _public_modules()
    assert {"interp_gpt", "interp_gpt.patching", "interp_gpt.sae", "interp_gpt.attribution"} <= modules.keys()
    missing = []
    for module, names in modules.items():
        page = (site / "api" / f"{module}.html").read_text(encoding="utf-8")
        if module == "interp_gpt":
            page += (site / "api" / "gpt.html").read_text(encoding="utf-8")
        missing += [f"{module}.{name}" for name in names if f'id="{module}.{name}"' not in page]
    assert not missing, f"public names with no entry in the API reference: {missing}"
    # the modules users import by name, as from transformer-lens (their pages list what they define)
    for module, names in {
        "interp_gpt.utils": ["get_act_name", "test_prompt", "Slice"],
        "interp_gpt.evals": importlib.import_module("interp_gpt.evals").__all__,
        "interp_gpt.head_detector": importlib.import_module("interp_gpt.head_detector").__all__,
        "interp_gpt.metrics": importlib.import_module("interp_gpt.metrics").__all__,
        "interp_gpt.inspect": importlib.import_module("interp_gpt.inspect").__all__,
        "interp_gpt.steering": importlib.import_module("interp_gpt.steering").__all__,
    }.items():
        page = (site / "api" / f"{module}.html").read_text(encoding="utf-8")
        missing += [f"{module}.{name}" for name in names if f'id="{module}.{name}"' not in page]
    assert not missing, f"names with no entry in the API reference: {missing}"
    # the entries hold the docstrings: GPT's inherited hook methods and a run-time-made sweep
    gpt = (site / "api" / "gpt.html").read_text(encoding="utf-8")
    assert 'id="interp_gpt.GPT.run_with_cache"' in gpt and "names_filter" in gpt
    patching = (site / "api" / "interp_gpt.patching.html").read_text(encoding="utf-8")
    assert "Activation patching of the residual stream" in patching, "get_act_patch_resid_pre's docstring"


def test_notebooks_are_pages_with_interactive_figures(site: Path) -> None:
    assert len(NOTEBOOKS) == 9
    plotly_js = site / "assets" / "javascripts" / "plotly.min.js"
    assert plotly_js.stat().st_size > 1_000_000, "plotly.js is served by the site itself"
    for name in NOTEBOOKS:
        page = (site / "demos" / f"{name}.html").read_text(encoding="utf-8")
        notebook = json.loads((REPO / "demos" / f"{name}.ipynb").read_text(encoding="utf-8"))
        figures = sum(
            "application/vnd.plotly.v1+json" in o.get("data", {})
            for c in notebook["cells"]
            for o in c.get("outputs", [])
        )
        assert figures > 0 and page.count('class="plotly-graph-div"') == figures, name
        assert page.count('src="../assets/javascripts/plotly.min.js"') == 1, name


def test_no_page_fetches_from_another_host(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    external = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if found := [m.group(2) for m in FETCHING.finditer(text)]:
            external[str(page.relative_to(site))] = found
        if re.search(r"url\(\s*['\"]?(?:https?:)?//", text):
            external.setdefault(str(page.relative_to(site)), []).append("a CSS url() on another host")
        if re.search(r"import\(\s*['\"](?:https?:)?//", text):  # nbconvert's mermaid loader, say
            external.setdefault(str(page.relative_to(site)), []).append("a script module from another host")
    assert not external, external
    for css in site.rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", css.read_text(encoding="utf-8")), css


# ----- in a browser ------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _chromium(flags: list[str] | None = None) -> DevTools:
    if CHROMIUM is None:
        pytest.skip(
            "headless Chromium not found on PATH (Debian: apt-get install -y chromium; or set INTERP_GPT_CHROMIUM)"
        )
    return DevTools(width=1400, height=1000, flags=flags)


@pytest.fixture
def browser() -> Iterator[DevTools]:
    """Chromium with the other browser tests' flags (no proxy that works, no DNS), but 127.0.0.1
    reachable: the site comes from a local server. The helper starts the page offline; requests
    are let through (every one is recorded and checked)."""
    flags = [f for f in FLAGS if not f.startswith("--host-resolver-rules=")]
    devtools = _chromium([*flags, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
    devtools.page(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    try:
        yield devtools
    finally:
        devtools.close()


@pytest.fixture
def offline_browser() -> Iterator[DevTools]:
    """Chromium as the other browser tests have it: offline, no proxy, no DNS."""
    devtools = _chromium()
    try:
        yield devtools
    finally:
        devtools.close()


def _open(browser: DevTools, url: str, ready: str) -> None:
    browser.page("Page.navigate", {"url": url})
    browser.wait_for(f"document.readyState === 'complete' && ({ready})", timeout=30)


def _type(browser: DevTools, text: str) -> None:
    for char in text:
        for kind in ("keyDown", "char", "keyUp"):
            params = {"type": kind, "text": char} if kind == "char" else {"type": kind, "key": char}
            browser.page("Input.dispatchKeyEvent", params)


def _read_the_site(browser: DevTools, base: str, local: tuple[str, ...]) -> None:
    """Home, search, a notebook page and GPT's API page, as a reader uses them; nothing went wrong
    and every request stayed on `local`."""
    # The home page.
    _open(browser, base + "index.html", "!!document.querySelector('.md-content h1')")
    assert browser.js("document.querySelector('.md-content h1').textContent.trim()").startswith("interp_gpt")
    assert browser.js("document.querySelectorAll('.md-nav__link').length") > 20

    # Search, as a reader does it: click the box and type; the results link to GPT.run_with_cache.
    browser.click(
        *browser.js(
            "(() => { const r = document.querySelector('.md-search__form').getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
    )
    browser.wait_for("document.activeElement === document.querySelector('.md-search__input')")
    _type(browser, "run_with_cache")
    hits = browser.wait_for(
        "(() => { const a = [...document.querySelectorAll('.md-search-result__item a')].map(a => a.href);"
        " return a.some(h => h.includes('run_with_cache')) ? a : null; })()",
        timeout=30,
    )
    assert any("/api/gpt.html" in h and h.endswith("#interp_gpt.GPT.run_with_cache") for h in hits), hits

    # A notebook page: plotly, served by the site, draws interactive figures (an SVG, with data).
    _open(browser, base + "demos/02_attention_heads.html", "!!document.querySelector('.plotly-graph-div .main-svg')")
    browser.wait_for("document.querySelectorAll('.plotly-graph-div .main-svg').length >= 7", timeout=30)
    assert browser.js("typeof window.Plotly") == "object"
    assert browser.js(
        "[...document.querySelectorAll('.plotly-graph-div')].every(g => g.data && g.data.length > 0 && !!g._fullLayout)"
    )
    assert browser.js("document.querySelectorAll('.plotly-graph-div .modebar').length") >= 7  # its tool bar: zoom, pan

    # The API page of GPT shows run_with_cache with its docstring.
    _open(
        browser,
        base + "api/gpt.html#interp_gpt.GPT.run_with_cache",
        "!!document.getElementById('interp_gpt.GPT.run_with_cache')",
    )
    entry = browser.js("document.getElementById('interp_gpt.GPT.run_with_cache').closest('.doc-object').textContent")
    assert "run_with_cache" in entry and "names_filter" in entry

    # Nothing went wrong, and nothing was asked of another host.
    assert not browser.problems(), browser.problems()
    requests = browser.requests()
    assert any(r.endswith("plotly.min.js") for r in requests) and any("search" in r for r in requests), requests
    outside = [r for r in requests if not r.startswith(local)]
    assert not outside, outside
    # ... nor by the page's workers (the search index is read by a worker): every resource it timed
    loaded = browser.js("performance.getEntriesByType('resource').map(e => e.name)")
    assert all(r.startswith(local) for r in loaded), loaded


def test_site_served_in_headless_chromium(browser: DevTools, served: str) -> None:
    _read_the_site(browser, served, (served, "data:", "blob:"))


def test_site_from_the_file_system_in_headless_chromium(offline_browser: DevTools, site: Path) -> None:
    """Opened from the folder (file://): the offline plugin's page names, and search in a worker
    started by the site's own shim (docs/assets/javascripts/iframe-worker.js)."""
    _read_the_site(offline_browser, site.as_uri() + "/", ("file:", "data:", "blob:", "about:"))
