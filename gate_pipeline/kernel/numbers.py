"""Whole numbers read from text gate is handed (a flag, a cursor), strictly: ASCII digits only.

`int()` alone also reads "2_0", " 2 " and digits of other scripts ("²" is a digit to `str.isdigit`), and
a number of more digits than CPython converts is a ValueError of its own; here each is simply not a number.
"""
from __future__ import annotations

import re

MAX_DIGITS = 4300  # the most digits CPython converts to an int by default

_SIGNED = re.compile(r"[+-]?[0-9]+")
_UNSIGNED = re.compile(r"[0-9]+")


def whole_number(text: object, digits: int = MAX_DIGITS, signed: bool = True) -> int | None:
    """`text` as a whole number when it is one written plainly (an optional sign when `signed`, then 1 to
    `digits` ASCII digits), else None."""
    if not isinstance(text, str) or not 0 < len(text.lstrip("+-")) <= digits:
        return None
    return int(text) if (_SIGNED if signed else _UNSIGNED).fullmatch(text) else None
