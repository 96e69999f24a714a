"""Replay of production traces: real lengths and real inter-arrival gaps, optionally compressed in time.

Three formats, told apart by their content:
- Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens` (datetimes);
- BurstGPT CSV: `Timestamp` (seconds from the trace start), `Request tokens`, `Response tokens`
  (and `Model`, `Total tokens`, `Log Type`, ignored);
- Mooncake JSONL: one object a line with `timestamp` (milliseconds), `input_length`,
  `output_length` and `hash_ids`, the ids of the prompt's 512-token blocks: two requests with the
  same leading ids share that prefix, and the replay gives them the same leading tokens so a prefix
  cache sees what the production one saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from itlbench.errors import ConfigError

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512
_FORMAT = "%Y-%m-%d %H:%M:%S%.f"
_FIX = ("give an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens), a BurstGPT CSV (Timestamp,Request tokens,"
        "Response tokens) or a Mooncake JSONL (timestamp, input_length, output_length, hash_ids)")


@dataclass(frozen=True)
class Trace:
    """Rows of a trace, with arrival offsets relative to the first selected row."""

    path: str
    offsets_s: np.ndarray  # float64 seconds, non-decreasing, offsets_s[0] == 0
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    blocks: tuple[tuple[int, ...], ...] | None = None  # Mooncake: each row's prefix-block ids
    format: str = "azure"
    invalid_rows: int = 0  # selected rows skipped: a missing, zero or negative token count

    def __len__(self) -> int:
        return len(self.offsets_s)


@dataclass(frozen=True)
class TraceReplay:
    """A trace made ready to send: scaled send times and lengths clipped to the context."""

    send_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    clipped_rows: int  # rows whose prompt or output had to be shortened to fit max_model_len
    blocks: tuple[tuple[int, ...], ...] | None = None  # shared-prefix block ids per row (Mooncake)
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    invalid_rows: int = 0  # rows of the trace skipped as unusable (Trace.invalid_rows)


def _is_jsonl(path: Path) -> bool:
    with path.open("rb") as fh:
        head = fh.read(256).lstrip()
    return head.startswith(b"{")


def _read(path: Path) -> pl.DataFrame:
    if not path.is_file():
        raise ConfigError("--trace", f"no trace file at '{path}'", _FIX)
    try:
        frame = pl.read_csv(path, infer_schema_length=0)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--trace", f"cannot read '{path}' as CSV: {exc}") from None
    if all(c in frame.columns for c in BURSTGPT_COLUMNS):
        return frame
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError("--trace", f"'{path}' lacks column(s) {', '.join(missing)}", _FIX)
    return frame


def _read_mooncake(path: Path) -> tuple[pl.DataFrame, tuple[tuple[int, ...], ...]]:
    rows: list[tuple[float, int, int]] = []
    blocks: list[tuple[int, ...]] = []
    with path.open() as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rows.append((float(obj["timestamp"]) / 1e3, int(obj["input_length"]), int(obj["output_length"])))
                blocks.append(tuple(int(h) for h in obj.get("hash_ids") or ()))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError("--trace", f"'{path}' line {n} is not a Mooncake record ({exc!r})",
                                  "each line a JSON object with " + ", ".join(MOONCAKE_KEYS) + " and hash_ids") from None
    frame = pl.DataFrame(rows, schema={"t": pl.Float64, "prompt": pl.Int64, "output": pl.Int64}, orient="row")
    return frame, tuple(blocks)


def _parse(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    """(t seconds, prompt, output) from either CSV format."""
    if all(c in frame.columns for c in BURSTGPT_COLUMNS):
        try:
            return frame.select(
                pl.col("Timestamp").str.strip_chars().cast(pl.Float64).alias("t"),
                pl.col("Request tokens").str.strip_chars().cast(pl.Int64).alias("prompt"),
                pl.col("Response tokens").str.strip_chars().cast(pl.Int64).alias("output"))
        except pl.exceptions.PolarsError as exc:
            raise ConfigError("--trace", f"bad values in '{path}': {exc}",
                              "BurstGPT: Timestamp in seconds, integer token counts") from None
    try:
        stamps = frame.select(
            pl.col("TIMESTAMP").str.strip_chars().str.to_datetime(_FORMAT, time_unit="ns"),
            pl.col("ContextTokens").str.strip_chars().cast(pl.Int64),
            pl.col("GeneratedTokens").str.strip_chars().cast(pl.Int64),
        )
    except pl.exceptions.PolarsError as exc:
        raise ConfigError("--trace", f"bad values in '{path}': {exc}",
                          "timestamps like 2023-11-16 18:15:46.680590, integer token counts") from None
    if stamps.height == 0:
        return pl.DataFrame(schema={"t": pl.Float64, "prompt": pl.Int64, "output": pl.Int64})
    t = stamps["TIMESTAMP"]
    return pl.DataFrame({"t": (t - t[0]).dt.total_nanoseconds().cast(pl.Float64) / 1e9,
                         "prompt": stamps["ContextTokens"], "output": stamps["GeneratedTokens"]})


def load_trace(path: str | Path, offset: int = 0, limit: int | None = None) -> Trace:
    """Read rows [offset, offset + limit) of a trace; arrival offsets start at 0 on the first
    selected row so a replay begins immediately."""
    if offset < 0:
        raise ConfigError("--trace-offset", f"must be >= 0, got {offset}", "rows to skip, e.g. 0")
    if limit is not None and limit <= 0:
        raise ConfigError("--trace-limit", f"must be > 0, got {limit}", "rows to replay, e.g. 1000")
    path = Path(path)
    blocks: tuple[tuple[int, ...], ...] | None = None
    if not path.is_file():
        raise ConfigError("--trace", f"no trace file at '{path}'", _FIX)
    if _is_jsonl(path):
        whole, all_blocks = _read_mooncake(path)
        kind = "mooncake"
        frame = whole.slice(offset, limit)
        blocks = all_blocks[offset:offset + frame.height]
    else:
        raw = _read(path)
        kind = "burstgpt" if all(c in raw.columns for c in BURSTGPT_COLUMNS) else "azure"
        frame = _parse(raw, path).slice(offset, limit)
    if frame.height == 0:
        where = f"after its first {offset}" if offset else "below its header"
        raise ConfigError("--trace", f"'{path}' has no rows {where}", "give a trace with at least one request")
    return _usable(path, frame, blocks, kind)


def _usable(path: Path, frame: pl.DataFrame, blocks: tuple[tuple[int, ...], ...] | None, kind: str) -> Trace:
    """The rows with usable lengths (a missing, zero or negative count is not one), offsets from the first;
    none usable is an error rather than a replay of one-token guesses."""
    prompt = frame["prompt"].fill_null(0).to_numpy().astype(np.int64)
    output = frame["output"].fill_null(0).to_numpy().astype(np.int64)
    keep = (prompt >= 1) & (output >= 1)
    if not keep.any():
        raise ConfigError("--trace", f"none of the {frame.height} rows of '{path}' has usable token counts",
                          "every row needs prompt and output tokens >= 1")
    t = frame["t"].to_numpy().astype(np.float64)[keep]
    offsets = t - t[0]
    if np.any(np.diff(offsets) < 0):
        raise ConfigError("--trace", f"'{path}' is not sorted by TIMESTAMP", "sort it by time")
    kept_blocks = None if blocks is None else tuple(b for b, k in zip(blocks, keep, strict=True) if k)
    return Trace(str(path), offsets, prompt[keep], output[keep], kept_blocks, kind, int((~keep).sum()))


def replay(trace: Trace, max_model_len: int, time_scale: float = 1.0,
           output_tokens: int | None = None) -> TraceReplay:
    """Send times = offsets / time_scale (2.0 plays twice as fast); prompts shortened so that
    prompt + output <= max_model_len, outputs to at most max_model_len - 1."""
    if time_scale <= 0:
        raise ConfigError("--time-scale", f"must be > 0, got {time_scale}",
                          "2.0 replays twice as fast, 0.5 half as fast")
    out_raw = trace.output_tokens if output_tokens is None else np.full(len(trace), output_tokens)
    out = np.clip(out_raw, 1, max_model_len - 1)
    prompt = np.clip(trace.prompt_tokens, 1, max_model_len - out)
    clipped = (out != out_raw) | (prompt != trace.prompt_tokens)
    return TraceReplay(trace.offsets_s / time_scale, prompt, out, int(clipped.sum()), trace.blocks,
                       invalid_rows=trace.invalid_rows)
