"""`--html FILE` for every command that prints report tables: check the path before any work,
write the self-contained page after (`gate_pipeline.html_report`), one-line errors either way."""
from __future__ import annotations

from pathlib import Path

from .errors import UsageError


def html_target(path: str | None) -> Path | None:
    """Check an --html path before any work is done: its folder must exist and it must not be a folder."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--html {path}: is a directory; give a file name")
    if not target.parent.is_dir():
        raise UsageError(f"--html {path}: folder {target.parent} does not exist")
    return target


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
