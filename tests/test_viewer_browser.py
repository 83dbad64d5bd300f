"""The attention viewer page in a real browser: headless Chromium, networking off.

Chromium is driven through the DevTools protocol over `--remote-debugging-pipe` (file
descriptors 3 and 4, NUL-separated JSON), so nothing beyond the standard library is needed.
The page is opened from disk; we record every JavaScript exception, console or log error,
dialog and network request, click the page's own menus with real mouse events, hover a
cell, and look at screenshots.

Needs Debian's `chromium` (`apt-get install -y chromium`); skips with that reason where it
is absent. `INTERP_GPT_CHROMIUM` may name another Chromium binary.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from interp_gpt import plots

CHROMIUM = os.environ.get("INTERP_GPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found on PATH (Debian: apt-get install -y chromium; or set INTERP_GPT_CHROMIUM)",
)

# This machine's Chromium flags, plus: no proxy that works and no DNS, so that a request
# the page should not make fails here instead of leaving the machine.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]

# Tokens that must show as text: markup, a script, an image with an onerror handler, TeX.
HOSTILE = ["<script>alert(1)</script>", '<img src=x onerror="alert(2)">', "<b>bold</b>", "$x$"]
STR_TOKENS = ["<|endoftext|>", HOSTILE[0], " the", "the", "\n", HOSTILE[1], " the"]


def _above_ten(fd: int) -> int:
    """`fd` moved to a number >= 10 (the old number is closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class DevTools:
    """A headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, width: int = 1000, height: int = 900, flags: list[str] | None = None) -> None:
        self.profile = tempfile.mkdtemp(prefix="interp_gpt_chromium_")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Above 10, so the shell's "3<&" cannot overwrite the other end before "4>&" reads it.
        to_chrome_r, from_chrome_w = (_above_ten(fd) for fd in (to_chrome_r, from_chrome_w))
        # Chromium reads commands on fd 3 and writes replies on fd 4; bash puts our pipe ends
        # there (dash's redirections take one-digit fds only).
        self.proc = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}',
                CHROMIUM,
                *(FLAGS if flags is None else flags),
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._last_id = 0
        self.events: list[dict[str, Any]] = []
        try:
            self._open_page(width, height)
        except BaseException:
            self.close()
            raise

    def _open_page(self, width: int, height: int) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"})
        self.session = self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})[
            "sessionId"
        ]
        self.page(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        for domain in ("Page", "Runtime", "Network", "Log", "Audits"):
            self.page(f"{domain}.enable")
        # The saved page forbids requests with a Content-Security-Policy, and a request the
        # policy blocks is never sent, so it would not show below. Bypass the policy: we see
        # every request the page itself tries to make.
        self.page("Page.setBypassCSP", {"enabled": True})
        self.page(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
        )

    # ----- the protocol ------------------------------------------------------
    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 30
    ) -> Any:
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next(deadline)
            if reply.get("id") == self._last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def page(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return self.call(method, params, session=self.session)

    def _next(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from chromium in time")
            if select.select([self._from_chrome], [], [], left)[0]:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed the DevTools pipe")
                self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def wait_for(self, expression: str, timeout: float = 15) -> Any:
        """Evaluate `expression` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"never true: {expression}")

    def settle(self, seconds: float) -> None:
        """Collect events for a while (e.g. after a click, before looking)."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._next(deadline))
        except TimeoutError:
            pass

    def js(self, expression: str) -> Any:
        reply = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    # ----- a person's actions ---------------------------------------------------
    def _mouse(self, kind: str, x: float, y: float, **extra: Any) -> None:
        self.page("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})

    def click(self, x: float, y: float) -> None:
        self._mouse("mouseMoved", x, y)
        self._mouse("mousePressed", x, y, button="left", clickCount=1)
        self._mouse("mouseReleased", x, y, button="left", clickCount=1)
        self.settle(0.3)

    def hover(self, x: float, y: float) -> None:
        self._mouse("mouseMoved", x, y)
        self.settle(0.3)

    def screenshot(self, selector: str | None = None) -> bytes:
        """A PNG of the page, or of the element `selector` picks."""
        params: dict[str, Any] = {"format": "png"}
        if selector:
            box = self.js(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                " return {x: r.x, y: r.y, width: r.width, height: r.height, scale: 1}; })()"
            )
            params["clip"] = box
        return base64.b64decode(self.page("Page.captureScreenshot", params)["data"])

    # ----- what happened ----------------------------------------------------
    def problems(self) -> list[str]:
        """JavaScript exceptions, console / log errors, dialogs: anything that went wrong."""
        found = []
        for e in self.events:
            method, params = e.get("method", ""), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Page.javascriptDialogOpening":
                found.append(f"dialog: {params.get('message')}")
            elif method == "Audits.issueAdded":
                found.append(f"issue: {params['issue'].get('code')} {json.dumps(params['issue'].get('details'))[:300]}")
        return found

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, EOFError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # only the process this test started
            self.proc.wait(timeout=10)
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB or RGBA PNG (what Chromium writes) into rows of RGB(A) bytes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unexpected PNG format {header}"
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for r in range(height):
        kind, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(x for j in range(0, stride, bpp) for x in row[j : j + 3]) for row in rows]


def colour_stats(png: bytes) -> tuple[float, int]:
    """(fraction of pixels that are not white, number of strongly blue pixels)."""
    width, height, rows = png_pixels(png)
    inked = blue = 0
    for row in rows:
        for i in range(0, len(row), 3):
            r, g, b = row[i], row[i + 1], row[i + 2]
            inked += min(r, g, b) < 245
            blue += b > 90 and b - r > 60
    return inked / (width * height), blue


# JavaScript that reads the page's state: which trace shows, and where things are.
PLOT = "document.querySelector('.js-plotly-plot')"
SHOWN = f"{PLOT}.data.filter(t => t.visible === true && t.opacity === 1).map(t => t.name)"


def menu_header(index: int) -> str:
    return (
        f"(() => {{ const r = document.querySelectorAll('.updatemenu-header-group')[{index}]"
        ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )


def menu_item(label: str) -> str:
    return (
        "(() => { const b = [...document.querySelectorAll('.updatemenu-dropdown-button-group .updatemenu-dropdown-button')]"
        f".find(e => e.textContent === {json.dumps(label)}); if (!b) return null;"
        " const r = b.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )


def cell_centre(q: int, k: int) -> str:
    return (
        f"(() => {{ const gd = {PLOT}, L = gd._fullLayout, r = gd.getBoundingClientRect();"
        f" return [r.x + L.xaxis._offset + L.xaxis.l2p({k}), r.y + L.yaxis._offset + L.yaxis.l2p({q})]; }})()"
    )


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    devtools = DevTools()
    try:
        yield devtools
    finally:
        devtools.close()


def test_viewer_page_in_headless_chromium(browser: DevTools, tiny_model, tiny_tokens, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad():  # make L0H2 sharp, so that it looks different from L0H0
        tiny_model.blocks[0].attn.W_Q[2] *= 60
    _, cache = tiny_model.run_with_cache(tiny_tokens)
    page = plots.save_html(plots.attention_viewer(cache, STR_TOKENS, layer=0, head=0), tmp_path / "viewer.html")
    url = page.resolve().as_uri()

    browser.page("Page.navigate", {"url": url})
    browser.wait_for(
        f"document.readyState === 'complete' && {PLOT} && document.querySelectorAll('.hm image').length > 0"
        " && document.querySelectorAll('.updatemenu-header-group').length === 2"
    )
    browser.settle(0.5)

    # Loaded: the tokens label both axes, as text (the hostile ones too), in order.
    want = plots.token_labels(STR_TOKENS)
    assert browser.js("[...document.querySelectorAll('.xtick text')].map(e => e.textContent)") == want
    assert browser.js("[...document.querySelectorAll('.ytick text')].map(e => e.textContent)") == want
    assert want[1] == HOSTILE[0] and want[5] == HOSTILE[1].replace(" ", "␣")
    # ... and nothing of them became an element: no <img>, no <b>, no script but plotly's and the page's.
    assert browser.js("document.querySelectorAll('img, b, svg script').length") == 0
    assert browser.js("[...document.scripts].filter(s => s.textContent.includes('alert(')).length") <= 1  # the data
    assert browser.js("[...document.scripts].some(s => /^\\s*alert\\(/.test(s.textContent))") is False

    assert browser.js(SHOWN) == ["L0H0"]
    # No button that would talk to a server (plotly's "share chart" one).
    assert browser.js("[...document.querySelectorAll('.modebar-btn')].map(e => e.getAttribute('data-title'))") == [
        "Download plot as a PNG",
        "Zoom",
        "Pan",
        "Zoom in",
        "Zoom out",
        "Autoscale",
        "Reset axes",
    ]
    first = browser.screenshot(".js-plotly-plot")
    if os.environ.get("INTERP_GPT_SCREENSHOTS"):  # to look at the pages yourself
        Path(os.environ["INTERP_GPT_SCREENSHOTS"], "viewer_first.png").write_bytes(first)
    plot_area = browser.screenshot(".nsewdrag")
    inked, blue = colour_stats(first)
    assert inked > 0.1 and blue > 500, f"the screenshot looks blank: {inked:.1%} inked, {blue} blue pixels"

    # Hover a cell: the probability and both tokens show.
    x, y = browser.js(cell_centre(q=3, k=2))
    browser.hover(x, y)
    hover = browser.wait_for("document.querySelector('.hoverlayer .hovertext')?.textContent")
    p = cache["pattern", 0][0, 0, 3, 2].item()
    assert f"attention {p:.3f}" in hover and "query 3: the" in hover and "key 2: ␣the" in hover, hover

    # Use the head menu like a person: open it, click "head 2".
    browser.click(*browser.js(menu_header(1)))
    browser.click(*browser.wait_for(menu_item("head 2")))
    assert browser.js(SHOWN) == ["L0H2"]
    # the numbers plotly drew (z arrives as binary; _fullData holds it decoded, rows of Float32Array)
    shown_z = browser.js(f"Array.from({PLOT}._fullData.find(t => t.name === 'L0H2').z, row => Array.from(row))")
    assert torch.allclose(torch.tensor(shown_z, dtype=torch.float64), cache["pattern", 0][0, 2].double(), atol=1e-6)
    browser.hover(x + 1, y)  # the same cell now answers with head 2's probability
    hover = browser.wait_for("document.querySelector('.hoverlayer .hovertext')?.textContent")
    assert f"attention {cache['pattern', 0][0, 2, 3, 2].item():.3f}" in hover, hover
    browser.hover(1, 1)  # away, so the hover label is not in the picture (nor was it in the first)
    second = browser.screenshot(".js-plotly-plot")
    if os.environ.get("INTERP_GPT_SCREENSHOTS"):
        Path(os.environ["INTERP_GPT_SCREENSHOTS"], "viewer_head2.png").write_bytes(second)
    assert second != first, "the picture did not change when the head changed"
    # ... and not only the menu's label: the heatmap itself (the plot area) changed
    assert browser.screenshot(".nsewdrag") != plot_area, "the heatmap did not change when the head changed"

    # The layer menu keeps the head: layer 1, head 2.
    browser.click(*browser.js(menu_header(0)))
    browser.click(*browser.wait_for(menu_item("layer 1")))
    assert browser.js(SHOWN) == ["L1H2"]
    assert browser.js(f"{PLOT}.layout.updatemenus.map(m => m.active)") == [1, 2]
    assert colour_stats(browser.screenshot(".js-plotly-plot"))[0] > 0.05

    # No JavaScript error, no dialog (no alert ran), and no request but the page itself.
    browser.settle(0.3)
    assert browser.problems() == []
    others = [u for u in browser.requests() if u != url and not u.startswith(("data:", "blob:"))]
    assert others == [], f"the page made network requests: {others}"
