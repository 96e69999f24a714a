"""A report as plain content (callouts, paragraphs, tables, figures), rendered to HTML and Markdown.

Both renderings come from one `Document`, so report.html and report.md never say different things.
HTML embeds every figure as a base64 PNG and carries its own CSS: no script, no network, and it
opens from disk. Markdown links the PNG files written beside it.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from itlbench.report.figure_spec import FigureSpec
from itlbench.report.style import save_png
from itlbench.rundir.outdir import make_dir


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    align_right_from: int = 1  # columns from this index on are numbers
    withdrawn: str = ""  # why the run's validity verdict withdrew figures of this table (said above it)
    invalid_rows: frozenset[int] = frozenset()  # rows holding a withdrawn figure (their label says so too)


@dataclass
class Callout:
    level: str  # ok | warn | bad | info
    text: str


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Links:
    """(text, relative path without extension) links to other reports: `.html` is appended in the
    HTML rendering and `.md` in the Markdown one, so each links to its own kind."""

    items: list[tuple[str, str]]


@dataclass(frozen=True)
class Definitions:
    items: list[tuple[str, str]]


Block = str | Table | FigureSpec | Code | Definitions | Links  # a str is a paragraph


@dataclass
class Section:
    """A titled run of blocks, rendered in the order given."""

    title: str
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> Section:
        self.blocks.extend(blocks)
        return self


@dataclass
class Document:
    title: str
    subtitle: str
    callouts: list[Callout]
    sections: list[Section]
    command: str = ""  # shown under the title: how to reproduce what the document shows


@dataclass
class Written:
    html: Path
    markdown: Path
    figures: list[Path]


CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1240px;margin:24px auto;
padding:0 20px;color:#222;line-height:1.45;background:#fff}
h1{font-size:1.6em;margin-bottom:0.1em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;
padding-bottom:3px}.subtitle{color:#555;margin-top:0}
.callout{padding:10px 14px;border-radius:6px;margin:8px 0;font-size:1.05em}
.ok{background:#e8f4e5;border-left:5px solid #54a24b}.warn{background:#fff4dd;border-left:5px solid #f2a900}
.bad{background:#fde4e4;border-left:5px solid #e45756}.info{background:#eef3f9;border-left:5px solid #4c78a8}
figure{margin:14px 0 22px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#444;font-size:0.92em;margin-top:4px}.note{color:#666;font-style:italic}
.withdrawn{color:#b3261e;font-weight:bold}tr.invalid td{background:#fde4e4;color:#7a1c16}
table{border-collapse:collapse;margin:8px 0 14px 0;font-size:0.92em}
th,td{border-bottom:1px solid #e3e3e3;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}td.k{white-space:nowrap}
caption{caption-side:top;text-align:left;color:#555;padding-bottom:4px}
pre{background:#f6f6f6;padding:10px;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
pre.command{font-size:0.85em;margin:4px 0 10px 0;padding:6px 10px}
dt{font-weight:bold;margin-top:6px}dd{margin-left:18px}
"""


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def is_number(cell: str) -> bool:
    """Figures ("2.23 s", "1,024", "—") are right-aligned; words are not."""
    c = cell.strip().lstrip("+-−")
    return c == "—" or (c[:1].isdigit() and len(c.split()) <= 2)


SHORT_LABEL = 24  # a row label this short never wraps (a wrapped label reads as two rows)


def _cell_class(t: Table, column: int, cell: str) -> str:
    if column >= t.align_right_from and is_number(cell):
        return ' class="n"'
    return ' class="k"' if column == 0 and len(cell) <= SHORT_LABEL else ""


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in t.headers) if any(t.headers) else ""  # no blank bar over a key-value table
    body = []
    for k, row in enumerate(t.rows):
        cells = "".join(f"<td{_cell_class(t, i, c)}>{_esc(c)}</td>" for i, c in enumerate(row))
        tr = '<tr class="invalid">' if k in t.invalid_rows else "<tr>"
        body.append(f"{tr}{cells}</tr>")
    mark = f'<span class="withdrawn">{_esc(withdrawn_text(t.withdrawn))}</span> ' if t.withdrawn else ""
    cap = f"<caption>{mark}{_esc(t.caption)}</caption>" if t.caption or mark else ""
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f"<table>{cap}{thead}<tbody>{''.join(body)}</tbody></table>"


def _md_table(t: Table) -> str:
    def cell(c: str) -> str:
        return c.replace("|", "\\|").replace("\n", " ")

    lines = []
    if t.withdrawn:
        lines += [f"**{withdrawn_text(t.withdrawn)}**", ""]
    if t.caption:
        lines += [f"*{t.caption}*", ""]
    lines.append("| " + " | ".join(cell(h) for h in t.headers) + " |")
    numeric = [i >= t.align_right_from and all(is_number(r[i]) for r in t.rows if i < len(r))
               for i in range(len(t.headers))]
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def write_document(doc: Document, out_dir: Path, stem: str = "report") -> Written:
    """report.html (figures inline) and report.md (+ figures/<key>.png) in `out_dir`."""
    make_dir(out_dir)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    pngs: dict[str, bytes] = {}
    paths = []
    for section in doc.sections:
        for spec in section.blocks:
            if isinstance(spec, FigureSpec) and spec.figure is not None:
                path = fig_dir / f"{spec.key}.png"
                pngs[spec.key] = save_png(spec.figure, path)
                paths.append(path)
    html_path = out_dir / f"{stem}.html"
    html_path.write_text(_render_html(doc, pngs), encoding="utf-8")
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(_render_md(doc, set(pngs)), encoding="utf-8")
    return Written(html_path, md_path, paths)


def withdrawn_text(why: str) -> str:
    """The one wording of a withdrawn figure's mark, above a table or in a figure's caption."""
    return f"Not valid: {why}."


def _html_block(b: Block, pngs: dict[str, bytes]) -> str:
    if isinstance(b, str):
        return f"<p>{_esc(b)}</p>"
    if isinstance(b, Table):
        return _html_table(b)
    if isinstance(b, Code):
        return f"<pre>{_esc(b.text)}</pre>"
    if isinstance(b, Definitions):
        return "<dl>" + "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in b.items) + "</dl>"
    if isinstance(b, Links):
        return "<ul>" + "".join(f'<li><a href="{_esc(h)}.html">{_esc(t)}</a></li>' for t, h in b.items) + "</ul>"
    if b.key in pngs:
        data = base64.b64encode(pngs[b.key]).decode()
        mark = f'<span class="withdrawn">{_esc(withdrawn_text(b.withdrawn))}</span> ' if b.withdrawn else ""
        return (f'<figure id="fig-{b.key}"><img alt="{_esc(b.title)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{mark}<b>{_esc(b.title)}.</b> {_esc(b.caption)}</figcaption></figure>")
    return f'<p class="note"><b>{_esc(b.title)}:</b> {_esc(b.note or "not available for this run")}</p>'


def _md_block(b: Block, figures: set[str]) -> str:
    if isinstance(b, str):
        return b
    if isinstance(b, Table):
        return _md_table(b)
    if isinstance(b, Code):
        return f"```\n{b.text}\n```"
    if isinstance(b, Definitions):
        return "\n".join(f"- **{k}**: {v}" for k, v in b.items)
    if isinstance(b, Links):
        return "\n".join(f"- [{t}]({h}.md)" for t, h in b.items)
    if b.key in figures:
        mark = f"**{withdrawn_text(b.withdrawn)}** " if b.withdrawn else ""
        return f"![{b.title}](figures/{b.key}.png)\n\n{mark}**{b.title}.** {b.caption}"
    return f"*{b.title}: {b.note or 'not available for this run'}*"


def _render_html(doc: Document, pngs: dict[str, bytes]) -> str:
    parts = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_esc(doc.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{_esc(doc.title)}</h1><p class=\"subtitle\">{_esc(doc.subtitle)}</p>"]
    if doc.command:
        parts.append(f'<pre class="command">{_esc(doc.command)}</pre>')
    parts += [f'<div class="callout {c.level}">{_esc(c.text)}</div>' for c in doc.callouts]
    for s in doc.sections:
        parts.append(f"<h2>{_esc(s.title)}</h2>")
        parts += [_html_block(b, pngs) for b in s.blocks]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _render_md(doc: Document, figures: set[str]) -> str:
    marks = {"ok": "✅", "warn": "⚠️", "bad": "⛔", "info": "ℹ️"}
    lines = [f"# {doc.title}", "", f"*{doc.subtitle}*", ""]
    if doc.command:
        lines += ["```", doc.command, "```", ""]
    lines += [f"> {marks.get(c.level, '')} {c.text}\n" for c in doc.callouts]
    for s in doc.sections:
        lines += [f"## {s.title}", ""]
        for b in s.blocks:
            lines += [_md_block(b, figures), ""]
    return "\n".join(lines).rstrip() + "\n"
