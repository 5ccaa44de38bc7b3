"""Markdown tables for Dagster metadata (pandas' to_markdown needs `tabulate`; this does not)."""
from __future__ import annotations


def _cell(value) -> str:
    text = "∅" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(headers, rows) -> str:
    headers = list(headers)
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def md_code(text: str) -> str:
    return "```\n" + text + "\n```"
