"""mkdocs hooks for the documentation site (mkdocs.yml names this file under `hooks:`).

The site is built from what the repository already holds, so nothing is written twice:

- `<!-- readme: TITLE -->` in a page is replaced by the body of the README's section TITLE
  (up to the next heading of the same level), its links rewritten to where the files sit in
  the site. The README stays the one source of that text.
- The seven notebooks of `demos/` become pages `demos/NAME.ipynb` (rendered by mkdocs-jupyter,
  never executed): each plotly output is turned into an interactive figure whose plotly.js is
  served from the site itself (`assets/javascripts/plotly.min.js`, plotly's own copy), never
  from a CDN.
- `bench/README.md` becomes `benchmarks/details.md`, with the result files it links to.
- The API reference: one page per package with an `__all__` (the top-level `interp_gpt` and
  every subpackage) and per module users import by name (MODULES), one entry per exported name,
  read from the `__all__` lists themselves, so a new public name appears without editing the
  docs. `GPT` has a page of its own.
- Offline (mkdocs.yml: `theme.font: false`; Material's offline plugin, with the site's own file://
  Worker shim, docs/assets/javascripts/iframe-worker.js): nbconvert's CDN scripts (MathJax;
  mermaid, which no notebook uses) are left out of the notebook pages, and any page that would
  still load a script, style sheet, font, image or frame from another host is reported as a
  warning (which fails `mkdocs build --strict`).
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import posixpath
import re
import sys
import typing
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from public_api import public_modules  # noqa: E402  (the names the API reference lists; the docstring test's too)

log = logging.getLogger("mkdocs.hooks.interp_gpt")

REPO = Path(__file__).resolve().parents[1]
PLOTLY_JS = "assets/javascripts/plotly.min.js"
# Where the generated notebooks are written (ignored by git: see .gitignore).
BUILD = REPO / ".cache" / "docs"


# ----- the README, split into pages ---------------------------------------------------------
def _readme_sections() -> dict[str, tuple[int, str]]:
    """Section title -> (heading level, body), for every heading of README.md outside code."""
    sections: dict[str, tuple[int, str]] = {}
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    heads, fenced = [], False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^(#{1,6}) (.+)$", line)):
            heads.append((i, len(m.group(1)), m.group(2).strip()))
    for n, (i, level, title) in enumerate(heads):
        # the title's section (level 1) is the introduction alone, up to the first section
        end = next((j for j, lvl, _ in heads[n + 1 :] if lvl <= level or level == 1), len(lines))
        sections[title] = (level, "\n".join(lines[i + 1 : end]).strip("\n"))
    return sections


def _rewrite_links(text: str, page_uri: str) -> str:
    """README links (relative to the repository root) made relative to the page `page_uri`."""
    here = posixpath.dirname(page_uri)

    def target(path: str) -> str:
        if path.startswith("docs/"):  # the README's pictures live in docs/, the site's root
            site_path = path[len("docs/") :]
        elif path.startswith("demos/") or path.startswith("bench/"):
            site_path = {"bench/README.md": "benchmarks/details.md"}.get(path, path)
        else:
            return path
        return posixpath.relpath(site_path, here or ".")

    return re.sub(
        r"\]\(([^)#\s]+)([^)]*)\)",
        lambda m: m.group(0) if "://" in m.group(1) else f"]({target(m.group(1))}{m.group(2)})",
        text,
    )


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if "<!-- readme:" not in markdown:
        return markdown
    sections = _readme_sections()

    def include(m: re.Match[str]) -> str:
        title = m.group(1).strip()
        if title not in sections:
            log.warning("%s: the README has no section %r", page.file.src_uri, title)
            return ""
        return _rewrite_links(sections[title][1], page.file.src_uri)

    return re.sub(r"<!-- readme: (.+?) -->", include, markdown)


# ----- notebooks with interactive plotly figures --------------------------------------------
def _interactive(notebook: dict[str, Any], plotly_src: str) -> dict[str, Any]:
    """A copy of `notebook` where each plotly output also carries an HTML rendering (which
    nbconvert prefers to the PNG beside it); the first loads plotly.js from `plotly_src`."""
    import plotly.io as pio

    notebook = copy.deepcopy(notebook)
    first = True
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            figure = output.get("data", {}).get("application/vnd.plotly.v1+json")
            if figure is None:
                continue
            html = pio.to_html(
                {"data": figure.get("data", []), "layout": figure.get("layout", {})},
                include_plotlyjs=plotly_src if first else False,
                full_html=False,
                config={**figure.get("config", {}), "displaylogo": False},
                validate=False,
            )
            output["data"]["text/html"] = html
            first = False
    return notebook


def _generated(config: Any, src_uri: str, path: Path) -> File:
    return File.generated(config, src_uri, abs_src_path=str(path))


@event_priority(100)  # before mkdocs-jupyter's on_files, which wraps the notebooks
def on_files(files: Files, config: Any) -> Files:
    import plotly

    BUILD.mkdir(parents=True, exist_ok=True)
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    files.append(_generated(config, PLOTLY_JS, plotly_js))

    for source in sorted((REPO / "demos").glob("*.ipynb")):
        uri = f"demos/{source.name}"
        notebook = json.loads(source.read_text(encoding="utf-8"))
        # the page demos/NAME.ipynb is served as demos/NAME/index.html (or demos/NAME.html)
        page_dir = posixpath.dirname(uri) + (f"/{source.stem}" if config["use_directory_urls"] else "")
        converted = _interactive(notebook, posixpath.relpath(PLOTLY_JS, page_dir))
        out = BUILD / "demos" / source.name
        out.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(converted, indent=1, ensure_ascii=False)
        if not out.exists() or out.read_text(encoding="utf-8") != text:  # unchanged: mkdocs-jupyter's cache holds
            out.write_text(text, encoding="utf-8")
        # a plain File rooted in BUILD (not File.generated): mkdocs-jupyter reads its abs_src_path
        files.append(
            File(uri, src_dir=str(BUILD), dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"])
        )

    bench = REPO / "bench"
    files.append(_generated(config, "benchmarks/details.md", bench / "README.md"))
    for result in sorted((bench / "results").iterdir()):
        files.append(_generated(config, f"benchmarks/results/{result.name}", result))

    for module, names in public_modules().items():
        files.append(File.generated(config, f"api/{module}.md", content=_api_page(module, names)))
    return files


# ----- the API reference, from the __all__ lists ----------------------------------------------
def _api_page(module: str, names: list[str]) -> str:
    lines = [
        f"# `{module}`",
        "",
        f"::: {module}",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
        "",
    ]
    for name in names:
        if module == "interp_gpt" and name == "GPT":
            lines += ["## `GPT`", "", "The model: see [its own page](gpt.md).", ""]
            continue
        obj = getattr(importlib.import_module(module), name)
        if typing.get_origin(obj) is not None:  # a type alias (Metric = Callable[...]): griffe cannot follow it
            lines += [f"## `{name}` {{ #{module}.{name} }}", "", "A type alias:", "", f"    {name} = {obj!r}", ""]
            continue
        lines += [f"::: {module}.{name}", ""]
        if module in DYNAMIC:
            lines[-1:] = ["    options:", "      force_inspection: true", ""]
    return "\n".join(lines)


# Packages whose names are made at run time (patching's get_act_patch_* sweeps, and an __all__
# built from them), which griffe's static reading cannot see: their pages inspect the live objects.
DYNAMIC = {"interp_gpt.patching"}


# ----- offline: nothing fetched from another host ---------------------------------------------
# nbconvert's MathJax script: from a CDN, or with an empty src where mkdocs-jupyter's custom_mathjax_url is unset
CDN_SCRIPT = re.compile(r'<script[^>]*\bsrc="(?:https?://[^"]*)?"[^>]*>\s*</script>')
MERMAID = re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*?</script>', re.S)
EXTERNAL = re.compile(
    r'<(script|link|img|iframe|source|video|audio|embed)\b[^>]*\b(?:src|href)\s*=\s*["\']?(?:https?:)?//', re.I
)
CSS_URL = re.compile(r"url\(\s*['\"]?(?:https?:)?//", re.I)
JS_IMPORT = re.compile(r"import\(\s*['\"](?:https?:)?//")  # a script module loaded from another host


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        html = MERMAID.sub("", CDN_SCRIPT.sub("", html))
    return html


def on_post_page(output: str, page: Any, config: Any) -> str:
    for pattern in (EXTERNAL, CSS_URL, JS_IMPORT):
        if m := pattern.search(output):
            log.warning("%s would fetch from the network: %s", page.file.src_uri, output[m.start() : m.start() + 160])
    return output


# ----- griffe: the house's "Example:" sections read as Google style's "Examples:" -------------
def _griffe_extension() -> Any:
    import griffe

    class ExampleSections(griffe.Extension):
        """Rename `Example:` to `Examples:` in every docstring, so griffe renders the doctest lines
        as code (Google style knows only the plural; the singular would be an admonition of prose)."""

        def on_object(self, *, obj: Any, **kwargs: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.value = re.sub(r"^(\s*)Example:\s*$", r"\1Examples:", obj.docstring.value, flags=re.M)

    return ExampleSections


ExampleSections = _griffe_extension()
