"""Render the README's pictures with the project's own code: docs/attention_viewer.png and
docs/head_scores.png.

The model is `interp_gpt.inspect.planted_heads_model()`: 2 layers whose heads are set by
hand (L0H0 previous-token, L0H1 duplicate-token, L1H0 induction), so the pictures show
real structure rather than a random model's noise. The pages come from `plots.save_html`;
headless Chromium screenshots them (Debian: `apt-get install -y chromium`).

    python scripts/render_readme_pictures.py [--out docs] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from interp_gpt import plots
from interp_gpt.inspect import head_scores, planted_heads_model

# Twelve distinct letters, then the same twelve again: the second half is what an
# induction head predicts.
PROMPT = "fajdkelgbnmc" * 2

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=10000",
    "--default-background-color=ffffffff",
]


def screenshot(chromium: str, page: Path, png: Path, width: int, height: int) -> None:
    """Open `page` in headless Chromium (a fresh profile) and save a width x height PNG."""
    with tempfile.TemporaryDirectory(prefix="interp_gpt_render_") as profile:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )
    if not png.is_file() or png.stat().st_size < 1000:
        raise RuntimeError(f"chromium wrote no screenshot to {png}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    parser.add_argument("--chromium", default=os.environ.get("INTERP_GPT_CHROMIUM") or shutil.which("chromium"))
    args = parser.parse_args(argv)
    if not args.chromium:
        parser.error("headless Chromium not found: apt-get install -y chromium, or pass --chromium PATH")
    args.out.mkdir(parents=True, exist_ok=True)

    model = planted_heads_model()
    tokens = model.to_tokens(PROMPT)
    _, cache = model.run_with_cache(tokens)
    str_tokens = model.to_str_tokens(tokens)
    clean = {"displayModeBar": False}

    with tempfile.TemporaryDirectory(prefix="interp_gpt_pages_") as tmp:
        viewer = plots.attention_viewer(
            cache,
            str_tokens,
            layer=1,
            head=0,
            title="attention_viewer: the induction head L1H0 of a planted model",
        )
        page = plots.save_html(viewer, Path(tmp) / "viewer.html", config=clean)
        screenshot(args.chromium, page, args.out / "attention_viewer.png", viewer.layout.width, viewer.layout.height)

        scores = head_scores(model, seq_len=12, batch_size=8)
        fig = plots.head_scores_heatmap(scores, title="head_scores on repeated random tokens (planted model)")
        fig.update_layout(width=900, height=380)
        page = plots.save_html(fig, Path(tmp) / "head_scores.html", config=clean)
        screenshot(args.chromium, page, args.out / "head_scores.png", 900, 380)

    for name in ("attention_viewer.png", "head_scores.png"):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
