"""The plan report's building blocks (headings, paragraphs, tables, figures) and their two
renderings, markdown and one self-contained HTML file; pagesim.plan.report fills them."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass


# -- blocks -------------------------------------------------------------------------------------


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str  # may hold **bold** and `code`


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    sort_keys: list[list[float | None]] | None = None  # numbers the HTML sorts by, where the text has units


@dataclass
class Link:
    text: str
    href: str  # a file beside the report


@dataclass
class Figure:
    name: str  # file stem under plots/
    caption: str
    png: bytes


# -- rendering ----------------------------------------------------------------------------------


def render_markdown(blocks: list) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(b.headers) + " |", "|" + "---|" * len(b.headers)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Figure):
            out.append(f"![{b.caption}](plots/{b.name}.png)\n\n*{b.caption}*")
        elif isinstance(b, Link):
            out.append(f"[{b.text}]({b.href})")
    return "\n\n".join(out) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}table.sortable th{cursor:pointer}
table.sortable th[data-dir=asc]::after{content:" \\25B2"}table.sortable th[data-dir=desc]::after{content:" \\25BC"}
code{background:#f4f4f4;padding:1px 3px;font-size:90%}img{max-width:100%}figure{margin:1em 0}
figcaption{font-style:italic;font-size:13px}"""

# Click a header to sort its table (again to reverse): by each cell's data-sort number where it has
# one, else by its text; numbers before text, "-" last.
_SORT_SCRIPT = """document.querySelectorAll("table.sortable th").forEach(th => th.addEventListener("click", () => {
  const body = th.closest("table").tBodies[0], col = th.cellIndex, dir = th.dataset.dir === "asc" ? -1 : 1;
  th.closest("tr").querySelectorAll("th").forEach(h => delete h.dataset.dir);
  th.dataset.dir = dir > 0 ? "asc" : "desc";
  const key = td => td.dataset.sort !== undefined ? Number(td.dataset.sort) : td.textContent;
  const rank = v => typeof v === "number" ? 0 : v === "-" ? 2 : 1;
  [...body.rows].sort((a, b) => {
    const x = key(a.cells[col]), y = key(b.cells[col]);
    return rank(x) - rank(y) || dir * (x < y ? -1 : x > y ? 1 : 0);
  }).forEach(row => body.appendChild(row));
}));"""
_NUMBER = re.compile(r"^[-+$]?[\d,]*\.?\d+(?:%| s| ms| s/token| req/s)?$")


def _inline(text: str) -> str:
    t = html.escape(text, quote=False)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", t)


def render_html(blocks: list, title: str) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
           f"<style>{_CSS}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            out.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
            body = "".join("<tr>" + "".join(_cell(c, k) for c, k in zip(row, keys)) + "</tr>"
                           for row, keys in zip(b.rows, b.sort_keys or [[None] * len(b.headers)] * len(b.rows)))
            out.append(f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
        elif isinstance(b, Link):
            out.append(f'<p><a href="{html.escape(b.href)}">{html.escape(b.text)}</a></p>')
        elif isinstance(b, Figure):
            data = base64.b64encode(b.png).decode()
            out.append(f'<figure id="{b.name}"><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    out.append(f"<script>\n{_SORT_SCRIPT}\n</script>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _cell(text: str, sort_key: float | None) -> str:
    """A table cell: numbers right-aligned, with the number to sort by where the text has units."""
    numeric = sort_key is not None or bool(_NUMBER.match(text))
    attrs = (' class="num"' if numeric else "") + (f' data-sort="{sort_key!r}"' if sort_key is not None else "")
    return f"<td{attrs}>{html.escape(text)}</td>"


