"""Values Spark cannot hold, and the policy that decides what happens to them.

PostgreSQL has values with no Spark/Python equivalent: date/timestamp ±infinity, BC years, years
after 9999, numeric NaN/±Infinity in a DECIMAL column, arrays with explicit lower bounds or several
dimensions. Parsers never guess: they raise :class:`Unrepresentable` carrying what a "clamp" would
store, and the converter applies the configured policy:

- ``error`` (default): stop with a ValueConversionError naming the column and type, because a
  mirror that silently changes values is worse than one that stops;
- ``null``: store NULL (opt-in, lossy, documented);
- ``clamp``: store the nearest value Spark can hold (±infinity and out-of-range years to
  0001-01-01 / 9999-12-31 23:59:59.999999; arrays keep their elements, flattened bounds dropped).
"""

from __future__ import annotations

from typing import Literal

SpecialValuePolicy = Literal["error", "null", "clamp"]

_NO_CLAMP = object()


class Unrepresentable(Exception):
    """Raised by a parser for a value the mapped Spark type cannot hold."""

    def __init__(self, what: str, clamped: object = _NO_CLAMP) -> None:
        super().__init__(what)
        self.what = what
        self.clamped = clamped

    @property
    def can_clamp(self) -> bool:
        return self.clamped is not _NO_CLAMP
