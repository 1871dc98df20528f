"""A report page: sections of facts, commands, tables and figures, rendered as one HTML file that
needs no network (plotly.js inline) and as its Markdown twin. Every figure carries the table of
its numbers, for screen readers, copy-paste and print."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel.report.template import HTML, MARKDOWN

FIGURE_CONFIG = {"responsive": True, "displaylogo": False}


@dataclass
class Table:
    head: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Figure:
    """A plotly figure and the same numbers as a table."""

    title: str
    figure: Any
    table: Table


@dataclass
class Section:
    key: str  # the HTML id, and what tests look for
    title: str
    text: list[str] = field(default_factory=list)  # paragraphs
    facts: list[tuple[str, str]] = field(default_factory=list)  # term, value
    links: list[tuple[str, str]] = field(default_factory=list)  # label, URL
    commands: list[tuple[str, str]] = field(default_factory=list)  # what it does, command line
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    blocks: list[tuple[str, str]] = field(default_factory=list)  # title, preformatted text


@dataclass
class Page:
    title: str
    subtitle: str
    sections: list[Section]
    source: str  # where the numbers were read (stores, redacted)
    files: dict[str, str] = field(default_factory=dict)  # name -> text, written beside the page


def cell(value: Any, digits: int = 4) -> str:
    """A table cell: floats to `digits` significant digits, None as null."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _figure_html(figure: Figure, key: str, index: int) -> str:
    fig = figure.figure
    if not fig.layout.title.text:
        fig.update_layout(title_text=figure.title)
    fig.update_layout(autosize=True, margin={"l": 60, "r": 20, "t": 60, "b": 60})
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{key}-{index}",
                       config=FIGURE_CONFIG, default_width="100%",
                       default_height=f"{int(fig.layout.height or 420)}px")


def render_html(page: Page) -> str:
    import jinja2
    import plotly.offline

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    sections = [(s, [(f, _figure_html(f, s.key, i)) for i, f in enumerate(s.figures)])
                for s in page.sections]
    # The figures' HTML and plotly.js go in as they are (`| safe` in the template); every other
    # value is escaped.
    return env.from_string(HTML).render(page=page, sections=sections, generated=_now(),
                                        plotly_js=plotly.offline.get_plotlyjs())


def render_markdown(page: Page) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["md"] = _md_cell
    text = env.from_string(MARKDOWN).render(page=page, generated=_now())
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"  # one blank line between blocks


def _md_cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _now() -> str:
    return datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def write(page: Page, folder: Path) -> Path:
    """report.html, report.md and the page's files in `folder`; returns the HTML file."""
    folder.mkdir(parents=True, exist_ok=True)
    html = folder / "report.html"
    html.write_text(render_html(page), encoding="utf-8")
    (folder / "report.md").write_text(render_markdown(page), encoding="utf-8")
    for name, text in page.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return html
