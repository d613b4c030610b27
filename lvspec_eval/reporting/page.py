"""The report as a list of sections, rendered twice: one standalone HTML page (every plot embedded
as a base64 PNG, so it can be attached to a CI run or mailed without its folder) and a markdown page
with the same structure that renders on GitHub. Tables are tables in both; a collapsed section is a
<details> element in both. A cell may hold a line break ("\n")."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0 1.2em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; vertical-align: top; }
th { background: #f3f3f3; text-align: center; }
td:first-child, th:first-child, td.text { text-align: left; }
table.leaderboard td { white-space: nowrap; }
table.wide { font-size: 0.8em; }
.scroll { overflow-x: auto; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; flex: 1 1 540px; max-width: 100%; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #444; }
details > summary { cursor: pointer; font-weight: 600; margin: 0.8em 0; }
p.note { font-size: 0.85em; color: #444; }
"""


@dataclass(frozen=True)
class Table:
    headers: list[str]
    cells: list[list[str]]
    css: str = ""  # an HTML class: "leaderboard" (no wrapping) or "wide" (smaller font, scrolls in its box)
    element_id: str = ""


@dataclass(frozen=True)
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[Path, str]] = field(default_factory=list)  # (PNG, caption)
    bullets: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # small print, after the tables
    collapsed: bool = False
    element_id: str = ""


# ------------------------------------------------------------------------------------------ HTML


def _esc(text: str) -> str:
    return html.escape(str(text)).replace("\n", "<br>")


NUMBER = re.compile(r"^≈?[-+]?[\d.]+(x|%|e[-+]?\d+)?(\s|$)")  # "≈1 (0.99x)": a speedup too


def _td(cell: str) -> str:
    """Numbers align right (the stylesheet's default), words left."""
    return f"<td>{_esc(cell)}</td>" if cell == "-" or NUMBER.match(str(cell)) else f'<td class="text">{_esc(cell)}</td>'


def table_html(table: Table) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in table.headers)
    body = "\n".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in table.cells)
    attrs = (f' class="{table.css}"' if table.css else "") + (f' id="{table.element_id}"' if table.element_id else "")
    out = f"<table{attrs}>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"
    return f'<div class="scroll">{out}</div>' if table.css == "wide" else out


def figure_html(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def section_html(s: Section) -> str:
    body = [f"<p>{_esc(p)}</p>" for p in s.paragraphs]
    body += [table_html(t) for t in s.tables]
    if s.bullets:
        body.append("<ul>" + "".join(f"<li>{_esc(b)}</li>" for b in s.bullets) + "</ul>")
    if s.figures:
        body.append('<div class="figures">' + "".join(figure_html(p, c) for p, c in s.figures) + "</div>")
    body += [f'<p class="note">{_esc(n)}</p>' for n in s.notes]
    ident = f' id="{s.element_id}"' if s.element_id else ""
    if s.collapsed:
        return f"<details{ident}><summary>{_esc(s.title)}</summary>\n" + "\n".join(body) + "\n</details>"
    return f"<section{ident}><h2>{_esc(s.title)}</h2>\n" + "\n".join(body) + "\n</section>"


def render_html(title: str, intro: str, sections: list[Section]) -> str:
    parts = [
        "<!DOCTYPE html>",
        f'<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head><body>',
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">{_esc(intro)}</p>' if intro else "",
        *(section_html(s) for s in sections),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


# -------------------------------------------------------------------------------------- markdown


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


def table_markdown(table: Table) -> str:
    lines = ["| " + " | ".join(map(_md_cell, table.headers)) + " |", "|" + "---|" * len(table.headers)]
    return "\n".join(lines + ["| " + " | ".join(map(_md_cell, row)) + " |" for row in table.cells])


def section_markdown(s: Section) -> str:
    body = [*s.paragraphs, *(table_markdown(t) for t in s.tables)]
    body += ["\n".join(f"- {b}" for b in s.bullets)] if s.bullets else []
    body += [f"![{c}]({p.name})  \n*{c}*" for p, c in s.figures]
    body += s.notes
    if s.collapsed:  # GitHub renders markdown inside <details> when blank lines surround it
        return "\n\n".join([f"<details><summary>{html.escape(s.title)}</summary>", *body, "</details>"])
    return "\n\n".join([f"## {s.title}", *body])


def render_markdown(title: str, intro: str, sections: list[Section]) -> str:
    return "\n\n".join([f"# {title}", *([intro] if intro else []), *(section_markdown(s) for s in sections)]) + "\n"
