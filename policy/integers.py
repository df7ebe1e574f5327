"""The one integer parser for what an operator types or a file names: ASCII digits only (int()
also reads '1_0', ' 4 ' and Arabic-Indic '٤'), an optional sign, and a bounded length, so that
int() never meets a number past its 4,300-digit limit (a ValueError with a traceback) and a
range of 10**17 rows is refused before anything is built from it."""

from __future__ import annotations

from blockwidth.policy.errors import BlockwidthError

MAX_DIGITS = 100  # far past any bound the tool takes; far below int()'s 4,300


class IntegerError(BlockwidthError, ValueError):
    """``text`` is not an integer (``out_of_range`` False) or not one in range (True). ``value``
    is the integer where it was read (None past MAX_DIGITS); ``shown`` is how a message may quote
    the number: its digits, or their head and count when there are many."""

    def __init__(self, text: str, out_of_range: bool, value: int | None, reason: str):
        super().__init__(reason)
        self.text, self.out_of_range, self.value = text, out_of_range, value
        self.shown = str(value) if value is not None else shorten(text)


def shorten(text: str, limit: int = 40) -> str:
    """An input as a message quotes it: a 5,000-digit number must not make a 5,000-byte line."""
    text = str(text)
    digits = text.lstrip("+-")
    if len(text) <= limit:
        return text
    if digits.isascii() and digits.isdigit():
        return f"{text[:20]}... ({len(digits):,} digits)"
    return text[:limit - 3] + "..."


def parse_int(text: object, lo: int | None = None, hi: int | None = None, *, signed: bool = True) -> int:
    """The integer ``text`` spells (surrounding whitespace aside), within [lo, hi] where given.
    Raises IntegerError; its message is a default wording a front end may replace."""
    t = str(text).strip()
    digits = t[1:] if signed and t[:1] in "+-" else t
    if not digits or not digits.isascii() or not digits.isdigit():
        raise IntegerError(t, False, None, f"{shorten(repr(t))} is not an integer (ASCII digits only)")
    negative = t[:1] == "-"
    significant = digits.lstrip("0")
    # int() counts leading zeros toward its limit: read the significant digits only
    value = None if len(significant) > MAX_DIGITS else (-1 if negative else 1) * int(significant or "0")
    low = lo is not None and (value < lo if value is not None else negative)
    high = hi is not None and (value > hi if value is not None else not negative)
    if value is None or low or high:
        if lo is not None and hi is not None:
            bounds = f" {lo}..{hi}"
        elif lo is not None or hi is not None:
            bounds = f" (at least {lo})" if lo is not None else f" (at most {hi})"
        else:
            bounds = f" (more than {MAX_DIGITS} digits)"
        shown = str(value) if value is not None else shorten(t)
        raise IntegerError(t, True, value, f"{shown} is out of range{bounds}")
    return value
