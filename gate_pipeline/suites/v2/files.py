"""Staged files as suite v2 keeps them: CSV text, its header line first.

A v2 batch is the file that landed in staging, kept as text (`batch["csv"]`), and so are the
warehouse's earlier nights (`case["warehouse"][table]`): one string per table, so a case of
200,000-row batches costs about as much memory as the rows' text, and the loader streams it
into SQLite without building a Python object per row. Written with Python's csv module
(minimal quoting, "\\n" line ends); a field is never NULL (an empty field is "").
"""
from __future__ import annotations

import csv
import io
from itertools import chain, repeat
from typing import Iterable, Iterator


def write_csv(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    """The CSV text of a header and rows (every value a string)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def reader(text: str) -> Iterator[list[str]]:
    """Every line of a CSV text as a list of strings, the header first (strict quoting)."""
    return csv.reader(lines(text), strict=True)


def header_of(text: str) -> list[str]:
    """The header line's column names ([] for an empty text)."""
    return next(reader(text), [])


def rows_of(text: str) -> Iterator[list[str]]:
    """The data rows of a CSV text (the header skipped). A text with no quote, carriage return, NUL or
    empty line holds no quoted field, so each of its lines is its fields split at the commas, exactly as
    the csv module reads it: split so, a piece of the text at a time, without the csv module's cost per row."""
    if not plain(text):
        it = reader(text)
        next(it, None)
        return it
    return _split_rows(text)


def plain(text: str) -> bool:
    """Whether `text` reads the same split at line ends and commas as with the csv module."""
    return not ('"' in text or "\r" in text or "\x00" in text or "\n\n" in text or text.startswith("\n"))


def _split_rows(text: str) -> Iterator[list[str]]:
    header = True
    for chunk in _chunks(text):
        lines = chunk.split("\n")
        if not lines[-1]:  # the piece ended at a line end
            lines.pop()
        if header:
            header = False
            del lines[0]
        yield from map(str.split, lines, repeat(","))


def dict_rows(text: str) -> list[dict]:
    """The rows as dicts keyed by the header (for small files: docs, previews, tests)."""
    it = reader(text)
    header = next(it, [])
    return [dict(zip(header, row)) for row in it]


CHUNK_CHARS = 1 << 20


def _chunks(text: str) -> Iterator[str]:
    """The text in pieces of about CHUNK_CHARS characters, each ending at a line end."""
    start, size = 0, len(text)
    while start < size:
        end = text.find("\n", min(start + CHUNK_CHARS, size) - 1)
        end = size if end < 0 else end + 1
        yield text[start:end]
        start = end


def lines(text: str) -> Iterator[str]:
    """The text's lines, read a piece at a time (io.StringIO holds four bytes per character of
    what it is given: a 100 MB file read whole would cost 400 MB for as long as it is read)."""
    return chain.from_iterable(map(io.StringIO, _chunks(text)))
