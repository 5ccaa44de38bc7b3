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
    """The data rows of a CSV text (the header skipped), exactly as the csv module reads them. A text
    with no carriage return, NUL or empty line, and no quote in its header, is read a line at a time,
    a piece of the text at a time: a line without a quote is its fields split at the commas (no
    quoted field, and every record starts at a line start), a line with one is read alone by the csv
    module; from a line that is not a whole record alone (a quoted field that goes on to the next
    line) or one longer than the csv module's field limit, the csv module reads the rest."""
    if not splittable(text):
        return _read_from(text, 0)
    return _split_rows(text)


def splittable(text: str) -> bool:
    """Whether `text` can be read a line at a time (`rows_of`)."""
    end = text.find("\n")
    return not ("\r" in text or "\x00" in text or "\n\n" in text or end == 0
                or '"' in (text if end < 0 else text[:end]))


def _read_from(text: str, offset: int) -> Iterator[list[str]]:
    """The csv module's rows of the text from `offset` (a line start) on; the header skipped at 0."""
    it = csv.reader(chain.from_iterable(map(io.StringIO, _chunks(text, offset))), strict=True)
    if offset == 0:
        next(it, None)
    return it


def _split_rows(text: str) -> Iterator[list[str]]:
    quoted = '"' in text
    limit = csv.field_size_limit()
    offset = 0  # where the piece starts in the text
    for chunk in _chunks(text):
        lines = chunk.split("\n")
        if not lines[-1]:  # the piece ended at a line end
            lines.pop()
        skip = 1 if offset == 0 else 0  # the header line
        if lines and max(map(len, lines)) >= limit:
            yield from _read_from(text, offset)  # (its header skipped at 0)
            return
        if not quoted:
            yield from map(str.split, lines[skip:] if skip else lines, repeat(","))
        else:
            at = offset
            for i, line in enumerate(lines):
                if i >= skip:
                    if '"' not in line:
                        yield line.split(",")
                    else:
                        try:
                            row = next(csv.reader((line,), strict=True))
                        except csv.Error:
                            yield from _read_from(text, at)
                            return
                        yield row
                at += len(line) + 1
        offset += len(chunk)


def dict_rows(text: str) -> list[dict]:
    """The rows as dicts keyed by the header (for small files: docs, previews, tests)."""
    it = reader(text)
    header = next(it, [])
    return [dict(zip(header, row)) for row in it]


CHUNK_CHARS = 1 << 16  # a piece as io.StringIO holds it costs four times this in bytes


def _chunks(text: str, start: int = 0) -> Iterator[str]:
    """The text from `start` on in pieces of about CHUNK_CHARS characters, each ending at a line end."""
    size = len(text)
    while start < size:
        end = text.find("\n", min(start + CHUNK_CHARS, size) - 1)
        end = size if end < 0 else end + 1
        yield text[start:end]
        start = end


def lines(text: str) -> Iterator[str]:
    """The text's lines, read a piece at a time (io.StringIO holds four bytes per character of
    what it is given: a 100 MB file read whole would cost 400 MB for as long as it is read)."""
    return chain.from_iterable(map(io.StringIO, _chunks(text)))
