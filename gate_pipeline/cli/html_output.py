"""`--html FILE` for every command that prints report tables: check the path before any work,
write the self-contained page after (`gate_pipeline.html_report`), one-line errors either way."""
from __future__ import annotations

from pathlib import Path

from .common import output_file
from .errors import UsageError


def html_target(path: str | None) -> Path | None:
    """Check an --html path before any work is done (`common.output_file`: a page, or nothing, may be there)."""
    return None if path is None else output_file("--html", path, b"<!DOCTYPE html")


def save_html(target: Path | None, grades: dict, pages=None, **kw) -> None:
    """Write the page to --html's target (by `pages`, a `html_report.PageProcess`, when given)."""
    if target is None:
        return
    from ..html_report import write_html
    try:
        if pages is None:
            write_html(target, grades, **kw)
        else:
            pages.write_html(target, grades, **kw)
            pages.wait()
    except OSError as exc:
        raise UsageError(f"--html {target}: cannot write ({exc.strerror or exc})") from None
