"""Loader for the Azure LLM inference trace 2023 (Patel et al., "Splitwise", ISCA 2024).

Columns ``TIMESTAMP,ContextTokens,GeneratedTokens``: the invocation time (``2023-11-16 18:15:46.6805900``,
UTC, up to 7 fractional digits), the prompt length and the output length in tokens. The conversation
file (``AzureLLMInferenceTrace_conv.csv``) has 19,366 requests over 58 minutes; gpupool ships a gzip copy
(``gpupool/data/azure_llm_conv_2023.csv.gz``, CC-BY 4.0, see ``gpupool/data/README.md``).
"""

from __future__ import annotations

import datetime as dt
import gzip
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import StrPath, TraceFormatError, _Row, check_header, read_header

__all__ = ["AZURE_LLM_COLUMNS", "EMBEDDED_AZURE_LLM", "AzureLlmTrace", "load_azure_llm", "load_embedded_azure_llm"]

AZURE_LLM_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
EMBEDDED_AZURE_LLM = "azure_llm_conv_2023.csv.gz"
MAX_TOKENS = 10_000_000


@dataclass(frozen=True)
class AzureLlmTrace:
    """A request trace in arrays, in file order (rows must be in non-decreasing time).

    Attributes:
        time_s: (n,) float64, seconds since the first request (the first is 0.0).
        prompt_tokens: (n,) int64 prompt (context) tokens, >= 1.
        output_tokens: (n,) int64 generated tokens, >= 1.
        source: the file name (or ``"embedded:<name>"``).
        start: the first request's timestamp as written.
    """

    time_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str
    start: str

    def __len__(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last request."""
        return float(self.time_s[-1]) if len(self) else 0.0


def _timestamp(row: _Row) -> float:
    raw = row.text("TIMESTAMP")
    main, _, frac = raw.strip().partition(".")
    try:
        when = dt.datetime.fromisoformat(main)
        if frac and not frac.isdigit():
            raise ValueError
    except ValueError:
        raise row.error("TIMESTAMP", f"expected a time like '2023-11-16 18:15:46.6805900', got {raw!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp() + (float("0." + frac) if frac else 0.0)


def _parse(data: bytes, path: Path, source: str) -> AzureLlmTrace:
    """``data``: the CSV's bytes (decompressed); ``path`` names the file in errors."""
    _, header, records = read_header(path, data)
    check_header(path, header, AZURE_LLM_COLUMNS, ())
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    start = ""
    for line, fields in records:
        if len(fields) != len(header):
            raise TraceFormatError(path, line, None,
                                   f"expected {len(header)} fields ({','.join(header)}), got {len(fields)}")
        row = _Row(path, line, dict(zip(header, fields, strict=True)))
        t = _timestamp(row)
        if times and t < times[-1]:
            raise row.error("TIMESTAMP", f"time goes backwards ({row.raw('TIMESTAMP')} is before the previous row)")
        if not times:
            start = row.text("TIMESTAMP").strip()
        times.append(t)
        prompts.append(row.integer("ContextTokens", minimum=1, maximum=MAX_TOKENS))
        outputs.append(row.integer("GeneratedTokens", minimum=1, maximum=MAX_TOKENS))
    if not times:
        raise TraceFormatError(path, 2, None, "no requests (header only)")
    t_arr = np.asarray(times, dtype=np.float64)
    return AzureLlmTrace(t_arr - t_arr[0], np.asarray(prompts, dtype=np.int64),
                         np.asarray(outputs, dtype=np.int64), source, start)


def _gunzip(data: bytes, path: Path) -> bytes:
    if not path.name.endswith(".gz"):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise TraceFormatError(path, 1, None, f"not a valid gzip file ({exc})") from None


def load_azure_llm(path: StrPath) -> AzureLlmTrace:
    """Read an Azure LLM inference trace CSV (``.csv`` or ``.csv.gz``) into an :class:`AzureLlmTrace`.

    Raises:
        TraceFormatError: empty file, unknown/missing/duplicate column, a row with the wrong number of
            fields, a bad timestamp, a time earlier than the previous row's, a token count that is not an
            integer >= 1; the error names the file, the line and the column.
        OSError: the file cannot be read.
    """
    file = Path(path)
    return _parse(_gunzip(file.read_bytes(), file), file, file.name)


def load_embedded_azure_llm() -> AzureLlmTrace:
    """The conversation trace shipped with gpupool (``gpupool/data/azure_llm_conv_2023.csv.gz``)."""
    res = resources.files("gpupool.data").joinpath(EMBEDDED_AZURE_LLM)
    path = Path(EMBEDDED_AZURE_LLM)
    return _parse(_gunzip(res.read_bytes(), path), path, f"embedded:{EMBEDDED_AZURE_LLM}")
