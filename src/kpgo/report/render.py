"""The report in three forms: one self-contained HTML file (inline stylesheet, figures as base64 PNG data URIs,
nothing fetched from elsewhere), Markdown (tables and captions; figures only in the HTML) and JSON (each
section's raw numbers, tables and figure captions)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Any

from kpgo import __version__
from kpgo.report.model import Figure, Preformatted, Report, Section, Table
from kpgo.report.present import html_escape, html_table, md_cell, md_escape, md_table

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; background: #fff; margin: 0; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.4em; }
h2 { font-size: 1.25em; margin-top: 2.2em; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
p.meta, p.skipped { color: #555; margin: 0.3em 0; }
p.measured { color: #444; background: #f4f6f8; border-left: 3px solid #7a8ca3; padding: 6px 10px; font-size: 0.92em; }
nav ol { columns: 2; padding-left: 1.4em; margin: 0.6em 0 0; }
div.table { margin: 14px 0; overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; }
p.caption, figcaption { color: #555; font-size: 0.88em; margin: 6px 0 0; max-width: 1100px; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 4px 10px; text-align: left; vertical-align: bottom; }
td { white-space: nowrap; }
th { background: #f4f6f8; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { display: none; }
table.kv td:first-child { color: #555; }
figure { margin: 18px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
code { font-size: 0.92em; }
"""


def _figure_html(f: Figure, n: int) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="fig-{html_escape(f.id)}"><img src="data:image/png;base64,{data}" alt="{html_escape(f.alt)}">'
            f"<figcaption>Figure {n}. {html_escape(f.caption)}</figcaption></figure>")


def html_page(r: Report) -> str:
    nav = "".join(f'<li value="{s.number}"><a href="#{html_escape(s.id)}">{html_escape(s.title)}</a></li>' for s in r.sections)
    body = [
        f"<h1>{html_escape(r.title)}</h1>",
        f'<p class="meta">Run directory: <code>{html_escape(r.run_dir)}</code> · kpgo {html_escape(__version__)} · '
        "regenerate with <code>kpgo report RUN_DIR</code></p>",
        f'<p class="skipped">{html_escape(r.skipped_line())}</p>',
        f"<nav><ol>{nav}</ol></nav>",
    ]
    fig_no = 0
    for s in r.sections:
        body.append(f'<section id="{html_escape(s.id)}"><h2>{s.number}. {html_escape(s.title)}</h2>')
        body.append(f'<p class="measured">{html_escape(s.measured)}</p>')
        for b in s.blocks:
            if isinstance(b, Table):
                body.append(html_table(b))
            elif isinstance(b, Figure):
                fig_no += 1
                body.append(_figure_html(b, fig_no))
            elif isinstance(b, Preformatted):
                body.append(f"<pre>{html_escape(b.text)}</pre>")
            else:
                body.append(f"<p>{html_escape(b)}</p>")
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html_escape(r.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
            + "\n".join(body) + "\n</main>\n</body>\n</html>\n")


def _table_md(t: Table) -> list[str]:
    head = t.header if t.header != ["", ""] else ["item", "value"]
    # The caption goes above the table in Markdown, where a reader scrolling a plain file meets it first.
    table = md_table([md_cell(h) for h in head], [[md_cell(c) for c in row] for row in t.rows], t.numeric)
    return [f"*{md_cell(t.caption)}*", "", *table, ""]


def markdown(r: Report, intro: Sequence[str] | None = None) -> str:
    """The report in Markdown; `intro`: the paragraphs under the title instead of the report's (its run directory,
    kpgo's version, the skipped sections), for another view of the same model (kpgo.report.summary)."""
    head = [f"Run directory: `{r.run_dir}` · kpgo {__version__} · figures in report.html", md_escape(r.skipped_line())] if intro is None else intro
    lines = [f"# {r.title}", ""]
    for p in head:
        lines += [p, ""]
    fig_no = 0
    for s in r.sections:
        lines += [f"## {s.number}. {s.title}", "", f"> {md_escape(s.measured)}", ""]
        for b in s.blocks:
            if isinstance(b, Table):
                lines += _table_md(b)
            elif isinstance(b, Figure):
                fig_no += 1
                lines += [f"Figure {fig_no} (in report.html): {md_escape(b.caption)}", ""]
            elif isinstance(b, Preformatted):
                lines += ["```", b.text, "```", ""]
            else:
                lines += [md_escape(b), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _section_json(s: Section) -> dict[str, Any]:
    return {
        "number": s.number, "title": s.title, "measured": s.measured, "data": s.data,
        "tables": [{"caption": b.caption, "header": b.header, "rows": b.rows} for b in s.blocks if isinstance(b, Table)],
        "figures": [{"id": b.id, "caption": b.caption, "alt": b.alt, "png_bytes": len(b.png),
                     "png_sha256": hashlib.sha256(b.png).hexdigest()} for b in s.blocks if isinstance(b, Figure)],
        "paragraphs": [b for b in s.blocks if isinstance(b, str)],
        **({"preformatted": [b.text for b in s.blocks if isinstance(b, Preformatted)]} if any(isinstance(b, Preformatted) for b in s.blocks) else {}),
    }


def json_doc(r: Report) -> dict[str, Any]:
    return {
        "kind": "kpgo-report", "kpgo_version": __version__, "title": r.title, "run_dir": r.run_dir,
        "sections": {s.id: _section_json(s) for s in r.sections},
        "skipped": [{"id": s.id, "number": s.number, "title": s.title, "reason": s.reason} for s in r.skipped],
    }
