"""Reading a file gate is handed (a case file, a trajectory file, a store key, a transcript), safely.

Only a regular file is read: a device (`/dev/zero`), a FIFO nobody writes, a directory or a socket
is refused before a byte is read (the file is opened without blocking and checked with `fstat`),
and a file is read up to a limit, so a wrong path is one clear error, never a hang or a process
that grows until it is killed.
"""
from __future__ import annotations

import errno
import math
import os
import select
import stat
from pathlib import Path

from .errors import GateError

KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _size(n: int) -> str:
    """A size as a message gives it: exact bytes up to 10 MiB, else in MiB or GiB."""
    if n < 10 * 2**20:
        return f"{n:,} bytes"
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


PIECE = 2**20  # what a file that grew while it is read is read on in


def _read_up_to(fh, size: int, limit: int) -> bytes:
    """At most `limit` + 1 bytes of `fh`: the `size` fstat gave (and one more), then, only if the file grew, on in
    pieces. (Never `read(limit + 1)`: Python allocates a buffer of that size first, 4 GiB for a case file.)"""
    data = fh.read(size + 1)
    if len(data) <= size:
        return data
    parts, total = [data], len(data)
    while total <= limit:
        part = fh.read(min(PIECE, limit + 1 - total))
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)


def _shown(path: str | Path) -> str:
    """A path as an error message names it: cut at 200 characters (a name too long for the system is 5,000)."""
    text = str(path)
    return text if len(text) <= 200 else f"{text[:200]}...[{len(text):,} characters]"


def path_state(path: str | Path) -> str:
    """What is at `path`: "missing", "directory", "file" (a regular one) or "other"; a path the system cannot
    look up (a name too long for it, a NUL in it) is "missing": nothing can be there. For checks that would
    call `Path.exists()` or `is_dir()`, which raise on such a path (Python 3.11)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "missing"
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


class NotRegular(OSError):
    """What `open_regular` found is no regular file; `kind` says what it is ("a FIFO", ...)."""

    def __init__(self, kind: str):
        super().__init__(errno.EINVAL, f"is {kind}, not a regular file")
        self.kind = kind


_OPEN = os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str | Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> tuple[int, os.stat_result]:
    """(a descriptor, its fstat) of the regular file at `path`, opened with `flags` and never waiting (a FIFO
    nobody writes opens at once, no terminal becomes the process's); NotRegular, with the descriptor closed,
    when what is there is anything else (a directory, a FIFO, a device, a socket). OSError as `os.open` raises
    it; ValueError for a path no file's name can be (a NUL in it)."""
    fd = os.open(path, flags | _OPEN, mode)
    try:
        found = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)
        raise NotRegular(next((name for test, name in KINDS if test(found.st_mode)), "not a regular file"))
    return fd, found


def read_bytes(path: str | Path, what: str, limit: int | None, error: type[GateError] = GateError) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them (None: no limit); anything else is
    `error` with one line naming the file and `what` it should have been."""
    try:
        fd, mode = open_regular(path)
    except FileNotFoundError:
        raise error(f"{_shown(path)}: no such {what}") from None
    except NotRegular as exc:
        raise error(f"{_shown(path)}: is {exc.kind}, not a {what} (only regular files are read)") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, which no file's name holds
        raise error(f"{_shown(path)}: cannot read the {what} ({getattr(exc, 'strerror', None) or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        if limit is not None and mode.st_size > limit:
            raise error(f"{_shown(path)}: is {_size(mode.st_size)}; a {what} is read up to {_size(limit)}")
        try:
            data = fh.read() if limit is None else _read_up_to(fh, mode.st_size, limit)
        except OSError as exc:
            raise error(f"{_shown(path)}: cannot read the {what} ({exc.strerror or exc})") from None
        except MemoryError:
            raise error(f"{_shown(path)}: the {what} ({_size(mode.st_size)}) does not fit in this process's memory") from None
    if limit is not None and len(data) > limit:  # it grew while it was read
        raise error(f"{_shown(path)}: is more than {_size(limit)}; a {what} is read up to {_size(limit)}")
    return data


def writable_file(path: str | Path, what: str, error: type[GateError] = GateError) -> Path:
    """`path`, refused unless nothing is there or a regular file is: writing to a FIFO nobody reads holds the
    writer for ever (a signal does not end the wait), and a directory or a device is no `what`."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return Path(path)
    except (OSError, ValueError) as exc:
        raise error(f"{_shown(path)}: cannot write the {what} ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
        raise error(f"{_shown(path)}: is {kind}, not a {what} (only regular files are written)")
    return Path(path)


def json_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split at "\n" only. (`str.splitlines` also splits at U+2028, U+0085 and
    other characters a JSON string holds as they are, so a valid line was read as two broken ones.)"""
    return text.split("\n")


def read_text(path: str | Path, what: str, limit: int | None, error: type[GateError] = GateError) -> str:
    """`read_bytes` decoded as UTF-8 (text that is not is `error` too)."""
    try:
        return read_bytes(path, what, limit, error).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{_shown(path)}: the {what} is not UTF-8 text (byte {exc.start:,})") from None


def readable_within(fd: int, seconds: float) -> bool:
    """Whether descriptor `fd` has something to read (or is at its end) within `seconds`. With poll, not select:
    select refuses a descriptor numbered 1,024 or more, which a server holding many connections gives out."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(math.ceil(max(0.0, seconds) * 1000)))
