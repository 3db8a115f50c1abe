"""The error every trace loader raises, and the strict CSV reading the loaders share.

A trace file is read whole (the public traces are all under 5 MB), decoded as UTF-8 (a leading BOM is
ignored) and parsed with the stdlib :mod:`csv` module in strict mode. Line numbers are physical lines
of the file, 1-based, the header being line 1; a record that spans several lines (a quoted field with
a newline in it) is reported at the line where it starts.

Only completely empty lines are skipped (they carry no data); a line of blanks or of empty fields is
a malformed row like any other.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpupool.model import GpupoolError

__all__ = ["TraceFormatError"]

StrPath = str | os.PathLike[str]


class TraceFormatError(GpupoolError, ValueError):
    """A trace file that cannot be read as its format says.

    Attributes:
        path: the file (:class:`pathlib.Path`, as given by the caller).
        line: 1-based physical line number in the file (the header is line 1).
        column: the column the problem is in, or ``None`` when it concerns the whole row or file.
        message: what is wrong, without the location.

    ``str()`` gives ``"<file name>:<line>: column '<column>': <message>"`` (the ``column`` part is left
    out when ``column`` is ``None``), e.g.
    ``openb_pod_list_default.csv:12: column 'gpu_milli': expected an integer, got 'abc'``.
    """

    def __init__(self, path: StrPath, line: int, column: str | None, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.column = column
        self.message = message
        where = f"{self.path.name}:{line}: "
        if column is not None:
            where += f"column {column!r}: "
        super().__init__(where + message)

    def __reduce__(self):  # keep it picklable (multiprocessing) despite the 4-argument constructor
        return (type(self), (self.path, self.line, self.column, self.message))


# --------------------------------------------------------------------------------------------------
# Shared strict CSV reading (private to gpupool.traces).

_INT_RE = re.compile(r"-?[0-9]+")
_FLOAT_RE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


class _Row:
    """One data row: field access by column name, with typed, checked conversions."""

    __slots__ = ("path", "line", "_fields")

    def __init__(self, path: Path, line: int, fields: dict[str, str]) -> None:
        self.path = path
        self.line = line
        self._fields = fields

    def error(self, column: str | None, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.line, column, message)

    def has(self, column: str) -> bool:
        return column in self._fields

    def raw(self, column: str) -> str | None:
        """The field as written, or ``None`` when the file has no such column."""
        return self._fields.get(column)

    def text(self, column: str, *, allow_empty: bool = False) -> str:
        value = self._fields.get(column, "")
        if not value and not allow_empty:
            raise self.error(column, "empty value")
        return value

    def integer(self, column: str, *, minimum: int | None = 0, maximum: int | None = 2**53) -> int:
        value = self._fields[column]
        if not _INT_RE.fullmatch(value):
            raise self.error(column, f"expected an integer, got {value!r}")
        if len(value) > 30:
            raise self.error(column, f"value out of range: {value[:30]}...")
        number = int(value)
        _check_minimum(self, column, number, minimum)
        if maximum is not None and number > maximum:
            raise self.error(column, f"value {value} out of range (at most {maximum})")
        return number

    def number(self, column: str, *, minimum: float | None = 0.0, positive: bool = False,
               maximum: float | None = None) -> float:
        value = self._fields[column]
        if not _FLOAT_RE.fullmatch(value):
            raise self.error(column, f"expected a number, got {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise self.error(column, f"number out of range: {value!r}")
        if positive and number <= 0:
            raise self.error(column, f"expected a value > 0, got {value!r}")
        _check_minimum(self, column, number, minimum)
        if maximum is not None and number > maximum:
            raise self.error(column, f"expected a value <= {maximum:g}, got {value!r}")
        return number

    def optional_number(self, column: str, *, minimum: float | None = 0.0) -> float | None:
        """A float, or ``None`` when the field is empty or the column absent."""
        if not self._fields.get(column):
            return None
        return self.number(column, minimum=minimum)


def _check_minimum(row: _Row, column: str, number: float, minimum: float | None) -> None:
    if minimum is not None and number < minimum:
        if minimum == 0:
            raise row.error(column, f"negative value {row.raw(column)!r}")
        raise row.error(column, f"expected a value >= {minimum}, got {row.raw(column)!r}")


def _decode(path: Path, data: bytes | None = None) -> str:
    data = path.read_bytes() if data is None else data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceFormatError(path, line, None, f"not valid UTF-8 ({exc.reason})") from None


def read_header(path: StrPath, data: bytes | None = None) -> tuple[Path, list[str], Iterator[tuple[int, list[str]]]]:
    """Open a CSV trace and return ``(path, header, rows)``; ``rows`` yields ``(line, fields)``.

    ``data``: the file's bytes when already read (a decompressed or embedded file; ``path`` then only names it).

    Completely empty lines are skipped. Raises :class:`TraceFormatError` for an empty file, an empty
    header line or a CSV syntax error (e.g. an unterminated quote).
    """
    file = Path(path)
    reader = csv.reader(io.StringIO(_decode(file, data), newline=""), strict=True)

    def next_record() -> tuple[int, list[str]] | None:
        start = reader.line_num + 1
        try:
            return start, next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            raise TraceFormatError(file, start, None, f"CSV syntax error: {exc}") from None

    first = next_record()
    if first is None:
        raise TraceFormatError(file, 1, None, "empty file (no header)")
    _, header = first
    if not header:
        raise TraceFormatError(file, 1, None, "empty header line")

    def rows() -> Iterator[tuple[int, list[str]]]:
        while (record := next_record()) is not None:
            if record[1]:  # [] is a completely empty line
                yield record

    return file, header, rows()


def read_table(
    path: StrPath,
    required: Sequence[str],
    optional: Sequence[str] = (),
    *,
    unique: str | None = None,
) -> Iterator[_Row]:
    """Read a CSV trace whose header names ``required`` columns and any of ``optional`` ones.

    Columns may come in any order. Unknown, duplicate or missing columns, and rows whose field count
    differs from the header's, raise :class:`TraceFormatError`. With ``unique``, a value of that
    column seen twice raises too.
    """
    file, header, rows = read_header(path)
    check_header(file, header, required, optional)
    seen: dict[str, int] = {}
    for line, fields in rows:
        if len(fields) != len(header):
            raise TraceFormatError(
                file, line, None, f"expected {len(header)} fields ({','.join(header)}), got {len(fields)}"
            )
        row = _Row(file, line, dict(zip(header, fields, strict=True)))
        if unique is not None:
            key = row.text(unique)
            if key in seen:
                raise row.error(unique, f"duplicate value {key!r} (first on line {seen[key]})")
            seen[key] = line
        yield row


def check_header(file: Path, header: Sequence[str], required: Sequence[str], optional: Sequence[str]) -> None:
    known = set(required) | set(optional)
    seen: set[str] = set()
    for name in header:
        if name not in known:
            expected = ",".join([*required, *optional])
            raise TraceFormatError(file, 1, name, f"unknown column in header (expected columns: {expected})")
        if name in seen:
            raise TraceFormatError(file, 1, name, "duplicate column in header")
        seen.add(name)
    for name in required:
        if name not in seen:
            raise TraceFormatError(file, 1, name, f"required column missing from header {','.join(header)!r}")
