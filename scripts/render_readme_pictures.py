"""Render the README's pictures from the shipped model, `tiny-gpt2`, with the project's own code:

- docs/attention_viewer.png: the attention viewer page (`plots.attention_viewer` + `plots.save_html`)
  on a repeated random token sequence, opened on the top induction head, screenshotted by
  headless Chromium;
- docs/head_scores.png: `plots.head_scores_heatmap(inspect.head_scores(model))`;
- docs/patching.png: `patching.get_act_patch_resid_pre` on the README's "Cache and patch"
  induction example, drawn by `plots.patching_heatmap`.

The two heatmaps are exported by kaleido, which drives the same Chromium (Debian:
`apt-get install -y chromium`; kaleido is in the `dev` extra). Runs offline in about 20 s.

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

import plotly.graph_objects as go
import torch

from interp_gpt import GPT, patching, plots
from interp_gpt.files import atomic_path
from interp_gpt.inspect import head_scores, repeated_tokens
from interp_gpt.metrics import normalized_logit_diff

MODEL = "tiny-gpt2"
# The viewer's sequence: BOS, 15 random tokens, the same 15 again (an induction head's task).
VIEWER_SEQ_LEN, VIEWER_SEED = 15, 1

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


def export(fig: go.Figure, png: Path) -> None:
    """A static PNG of a plotly figure, at the size its layout sets (kaleido)."""
    with atomic_path(png) as tmp:  # a failed export leaves the old picture
        fig.write_image(tmp, format="png")
    if not png.is_file() or png.stat().st_size < 1000:
        raise RuntimeError(f"kaleido wrote no image to {png}")


def top_head(score: torch.Tensor) -> tuple[int, int]:
    """(layer, head) of the largest entry of a [n_layers, n_heads] score tensor."""
    layer, head = divmod(int(score.argmax()), score.shape[1])
    return layer, head


def readme_patching_example(model: GPT) -> tuple[torch.Tensor, list[str]]:
    """The README's "Cache and patch" example, as written there: the residual stream entering
    each layer patched from the clean run into the corrupted one, one position at a time
    ([n_layers, pos]; metric 0 = corrupted, 1 = clean), and a label per position."""
    gen = torch.Generator().manual_seed(0)
    seq, other = torch.randint(0, 2000, (2, 1, 12), generator=gen)
    clean = torch.cat([seq, seq[:, :-1]], dim=1)  # ... A B C ... A B -> C?
    corrupted = torch.cat([other, seq[:, :-1]], dim=1)  # first half replaced: nothing to copy
    answers = torch.stack([seq[:, -1], other[:, -1]], dim=1)  # [batch, 2]: (right, wrong)
    clean_logits, clean_cache = model.run_with_cache(clean)
    metric = normalized_logit_diff(answers, clean_logits, model(corrupted))
    by_pos = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric, progress=False)
    # Position i of either half holds token A_i of the clean sequence (B_i in the corrupted
    # run's first half); the answer is A_11.
    n = seq.shape[1]
    return by_pos, [f"A{i}" for i in range(n)] + [f"A{i}" for i in range(n - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    parser.add_argument("--chromium", default=os.environ.get("INTERP_GPT_CHROMIUM") or shutil.which("chromium"))
    args = parser.parse_args(argv)
    if not args.chromium or not Path(args.chromium).is_file():
        parser.error(f"--chromium: no headless Chromium at {args.chromium!r}: apt-get install -y chromium")
    os.environ["BROWSER_PATH"] = str(args.chromium)  # the browser kaleido drives
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)
    model = GPT.from_pretrained(MODEL)

    # Head scores: previous-token, duplicate-token and induction, on repeated random tokens.
    scores = head_scores(model)
    layer, head = top_head(scores["induction"])
    fig = plots.head_scores_heatmap(scores, title=f"head_scores({MODEL}) on repeated random tokens")
    fig.update_layout(width=900, height=380)
    export(fig, args.out / "head_scores.png")

    # The viewer, opened on the top induction head: in the second copy each query attends
    # to the token after its earlier copy, a stripe seq_len - 1 positions left of the diagonal.
    tokens = repeated_tokens(model, seq_len=VIEWER_SEQ_LEN, batch_size=1, seed=VIEWER_SEED)
    _, cache = model.run_with_cache(tokens)
    title = (
        f"attention_viewer: {MODEL}'s induction head L{layer}H{head} "
        f"(score {scores['induction'][layer, head]:.2f}), {VIEWER_SEQ_LEN} random tokens twice"
    )
    viewer = plots.attention_viewer(cache, model.to_str_tokens(tokens[0]), layer=layer, head=head, title=title)
    with tempfile.TemporaryDirectory(prefix="interp_gpt_pages_") as tmp:
        page = plots.save_html(viewer, Path(tmp) / "viewer.html", config={"displayModeBar": False})
        screenshot(args.chromium, page, args.out / "attention_viewer.png", viewer.layout.width, viewer.layout.height)

    # Activation patching on the README's induction example.
    by_pos, labels = readme_patching_example(model)
    fig = plots.patching_heatmap(
        by_pos,
        labels,
        title=f"get_act_patch_resid_pre on the README's induction example ({MODEL}): 1 = clean, 0 = corrupted",
        value_label="normalised logit diff",
    )
    fig.update_layout(width=900, height=330)
    export(fig, args.out / "patching.png")

    for name in ("attention_viewer.png", "head_scores.png", "patching.png"):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
