"""A single self-contained report.html: figures embedded as base64 PNG, no scripts, no network."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from klguard.commands.report.runs import RunRecord
from klguard.commands.report.summary import SUMMARY_ROWS, summary_value

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}img{max-width:100%}p.note{color:#555;font-size:.9em}
.ok{color:#1a7f37}.bad{color:#b42318}
"""

def _fmt(value: float | None) -> str:
    return "&ndash;" if value is None else f"{value:.4g}"


def summary_table(runs: Sequence[RunRecord]) -> str:
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    body = []
    for label, metric, how in SUMMARY_ROWS:
        cells = "".join(f"<td>{_fmt(summary_value(r, metric, how))}</td>" for r in runs)
        body.append(f"<tr><td class=l>{html.escape(label)}</td>{cells}</tr>")
    steps = "".join(f"<td>{r.steps}</td>" for r in runs)
    actions = "".join(f"<td>{r.action_count}</td>" for r in runs)
    body.append(f"<tr><td class=l>steps run</td>{steps}</tr><tr><td class=l>guard actions</td>{actions}</tr>")
    return f"<table><tr><th class=l>metric</th>{head}</tr>{''.join(body)}</table>"


def events_table(runs: Sequence[RunRecord]) -> str:
    rows = []
    for run in runs:
        for e in run.events:
            rows.append(f"<tr><td class=l>{html.escape(run.label)}</td><td>{e.get('step')}</td>"
                        f"<td class=l>{html.escape(str(e.get('kind')))}</td>"
                        f"<td class=l>{html.escape(str(e.get('rule')))}</td>"
                        f"<td class=l>{html.escape(str(e.get('reason')))}</td></tr>")
    if not rows:
        return "<p class=note>No guard actions (the guard was off or stayed quiet).</p>"
    return ("<table><tr><th class=l>run</th><th>step</th><th class=l>action</th><th class=l>rule</th>"
            f"<th class=l>reason</th></tr>{''.join(rows)}</table>")


def image(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, sections: Sequence[tuple[str, str]], intro: str = "") -> str:
    """Assemble a page from (heading, html body) sections."""
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    if intro:
        parts.append(f"<p class=note>{intro}</p>")
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
    parts.append("</body></html>")
    return "".join(parts)
