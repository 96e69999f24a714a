"""Replay of Azure-format traces (TIMESTAMP,ContextTokens,GeneratedTokens): real lengths and
real inter-arrival gaps, optionally compressed in time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from itlbench.errors import ConfigError

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_FORMAT = "%Y-%m-%d %H:%M:%S%.f"


@dataclass(frozen=True)
class Trace:
    """Rows of a trace, with arrival offsets relative to the first selected row."""

    path: str
    offsets_s: np.ndarray  # float64 seconds, non-decreasing, offsets_s[0] == 0
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offsets_s)


@dataclass(frozen=True)
class TraceReplay:
    """A trace made ready to send: scaled send times and lengths clipped to the context."""

    send_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    clipped_rows: int  # rows whose prompt or output had to be shortened to fit max_model_len


def _read(path: Path) -> pl.DataFrame:
    if not path.is_file():
        raise ConfigError("--trace", f"no trace file at '{path}'",
                          "give a CSV with columns TIMESTAMP,ContextTokens,GeneratedTokens")
    try:
        frame = pl.read_csv(path, infer_schema_length=0)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--trace", f"cannot read '{path}' as CSV: {exc}") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError("--trace", f"'{path}' lacks column(s) {', '.join(missing)}",
                          f"the Azure trace format has {','.join(COLUMNS)}")
    return frame


def _parse(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    try:
        return frame.select(
            pl.col("TIMESTAMP").str.strip_chars().str.to_datetime(_FORMAT, time_unit="ns"),
            pl.col("ContextTokens").str.strip_chars().cast(pl.Int64),
            pl.col("GeneratedTokens").str.strip_chars().cast(pl.Int64),
        )
    except pl.exceptions.PolarsError as exc:
        raise ConfigError("--trace", f"bad values in '{path}': {exc}",
                          "timestamps like 2023-11-16 18:15:46.680590, integer token counts") from None


def load_trace(path: str | Path, offset: int = 0, limit: int | None = None) -> Trace:
    """Read rows [offset, offset + limit) of a trace; arrival offsets start at 0 on the first
    selected row so a replay begins immediately."""
    if offset < 0:
        raise ConfigError("--trace-offset", f"must be >= 0, got {offset}", "rows to skip, e.g. 0")
    if limit is not None and limit <= 0:
        raise ConfigError("--trace-limit", f"must be > 0, got {limit}", "rows to replay, e.g. 1000")
    path = Path(path)
    frame = _parse(_read(path), path).slice(offset, limit)
    if frame.height == 0:
        raise ConfigError("--trace", f"'{path}' has no rows from row {offset}",
                          "use a smaller offset")
    stamps = frame["TIMESTAMP"]
    offsets = (stamps - stamps[0]).dt.total_nanoseconds().to_numpy().astype(np.float64) / 1e9
    if np.any(np.diff(offsets) < 0):
        raise ConfigError("--trace", f"'{path}' is not sorted by TIMESTAMP", "sort it by time")
    return Trace(str(path), offsets, frame["ContextTokens"].to_numpy().astype(np.int64),
                 frame["GeneratedTokens"].to_numpy().astype(np.int64))


def replay(trace: Trace, max_model_len: int, time_scale: float = 1.0,
           output_tokens: int | None = None) -> TraceReplay:
    """Send times = offsets / time_scale (2.0 plays twice as fast); prompts shortened so that
    prompt + output <= max_model_len, outputs to at most max_model_len - 1."""
    if time_scale <= 0:
        raise ConfigError("--trace-time-scale", f"must be > 0, got {time_scale}",
                          "2.0 replays twice as fast, 0.5 half as fast")
    out_raw = trace.output_tokens if output_tokens is None else np.full(len(trace), output_tokens)
    out = np.clip(out_raw, 1, max_model_len - 1)
    prompt = np.clip(trace.prompt_tokens, 1, max_model_len - out)
    clipped = (out != out_raw) | (prompt != trace.prompt_tokens)
    return TraceReplay(trace.offsets_s / time_scale, prompt, out, int(clipped.sum()))
