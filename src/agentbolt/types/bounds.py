"""Bounds of the integers the HTTP API accepts, so that every value a request carries fits every store backend.

SQLite's INTEGER and Postgres' BIGINT are signed 64-bit: a larger Python int cannot be stored or compared in a query
(``OverflowError``). Request models bound their ints with these (``Field(ge=INT64_MIN, le=INT64_MAX)``), so such a
value is a 422 naming the field rather than a 500. Floats that reach JSON are bounded with ``allow_inf_nan=False``.
"""

from __future__ import annotations

from typing import Final

INT64_MIN: Final = -(2**63)
"""Smallest signed 64-bit integer."""

INT64_MAX: Final = 2**63 - 1
"""Largest signed 64-bit integer."""

INT32_MAX: Final = 2**31 - 1
"""Largest signed 32-bit integer: the bound of the columns Postgres keeps as INTEGER (``sample_index``) and of token
positions within one sample."""
