"""The report's Markdown: frames as Markdown tables, p-values as text, and the report as HTML.

HTML comes from markdown-it-py (CommonMark with GFM tables; raw HTML in the text is escaped, not
passed through); the appendix is folded in a ``<details>`` element."""
from __future__ import annotations

import polars as pl
from markdown_it import MarkdownIt

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
         "img{max-width:100%}")
APPENDIX_SUMMARY = "Appendix: every comparison and the long tables"


def md_table(df: pl.DataFrame, digits: int = 3) -> str:
    """A frame as a Markdown table, floats rounded to ``digits``, nulls as "—"."""
    if df.is_empty():
        return "_no data_\n"
    df = df.with_columns([pl.col(c).round(digits) for c, t in df.schema.items() if t in (pl.Float64,
            pl.Float32)])
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.iter_rows():
        lines.append("| " + " | ".join("—" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def p_text(df: pl.DataFrame) -> pl.DataFrame:
    """p-values as text with two significant digits, so that a small one never rounds to 0."""
    return df.with_columns(pl.col(c).map_elements(lambda p: "" if p != p else f"{p:.2g}",
                                                  return_dtype=pl.String)
                           for c in ("p_value", "p_holm") if c in df.columns)


def to_html(text: str, appendix: str = "") -> str:
    """The report's Markdown as one HTML page; the appendix (if any) folded under a summary line."""
    renderer = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = renderer.render(text)
    if appendix:
        body += f"<details><summary>{APPENDIX_SUMMARY}</summary>\n{renderer.render(appendix)}</details>\n"
    return (f"<html><head><meta charset='utf-8'><style>{STYLE}</style></head><body>\n"
            f"{body}</body></html>\n")
