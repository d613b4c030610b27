"""The leaderboard as one standalone HTML page: the table, then every plot embedded as a base64
PNG, so the page can be attached to a CI run or mailed without its folder."""

from __future__ import annotations

import base64
import html
from pathlib import Path

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f3f3f3; }
td:nth-child(-n+2) { text-align: left; }
figure { margin: 2em 0; }
pre { background: #f7f7f7; padding: 1em; }
"""


def table_html(headers: list[str], cells: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def figure_html(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def render_page(
    title: str, headers: list[str], cells: list[list[str]], figures: list[tuple[Path, str]], notes: list[str]
) -> str:
    """figures: (PNG path, caption); notes: preformatted text sections (shown verbatim)."""
    parts = [
        "<!DOCTYPE html>",
        f'<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head><body>',
        f"<h1>{html.escape(title)}</h1>",
        table_html(headers, cells),
        *(figure_html(path, caption) for path, caption in figures),
        *(f"<pre>{html.escape(note)}</pre>" for note in notes if note),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
