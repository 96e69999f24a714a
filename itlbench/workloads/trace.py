"""Replay of production traces: real lengths and real inter-arrival gaps, optionally compressed in time.

Three formats, told apart by their content:
- Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens` (datetimes; a time zone, `+01:00` or
  `Z`, is read and every row taken to UTC, so a trace across a clock change keeps its real gaps);
- BurstGPT CSV: `Timestamp` (seconds from the trace start), `Request tokens`, `Response tokens`
  (and `Model`, `Total tokens`, `Log Type`, ignored);
- Mooncake JSONL: one object a line with `timestamp` (milliseconds), `input_length`,
  `output_length` and `hash_ids`, the ids of the prompt's 512-token blocks: two requests with the
  same leading ids share that prefix, and the replay gives them the same leading tokens so a prefix
  cache sees what the production one saw.

Any of them may be gzip-compressed and may start with a UTF-8 byte-order mark or end its lines with CRLF.
A value that cannot be read (not a number, not a time, NaN or infinite, a fraction of a token) is refused
with the line it is on; a row with a missing, zero or negative token count is skipped and counted.
"""

from __future__ import annotations

import gzip
import io
import json
import math
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
_MAX_TOKENS = 1 << 53  # past every context; still exact in a float
_MAX_SPAN_S = 9.2e9  # ~290 years: int64 nanoseconds hold ±9.22e18
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_FIX = ("give an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens), a BurstGPT CSV (Timestamp,Request tokens,"
        "Response tokens) or a Mooncake JSONL (timestamp, input_length, output_length, hash_ids)")
_AZURE_FIX = "timestamps like 2023-11-16 18:15:46.680590, with or without a time zone such as +00:00 or Z, integer token counts"
_BURST_FIX = "BurstGPT: Timestamp in seconds, integer token counts"
_MOON_FIX = "each line a JSON object with " + ", ".join(MOONCAKE_KEYS) + " and hash_ids"
_TIME_COLUMN = {"azure": "TIMESTAMP", "burstgpt": "Timestamp", "mooncake": "timestamp"}


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


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


def _head(path: Path, gz: bool) -> bytes:
    try:
        with (gzip.open(path, "rb") if gz else path.open("rb")) as fh:
            head = fh.read(256)
    except (OSError, EOFError) as exc:
        raise ConfigError("--trace", f"cannot read '{path}' as gzip: {exc}",
                          "give the trace itself, or a whole .gz of it") from None
    return head.removeprefix(_BOM)


def _is_jsonl(head: bytes) -> bool:
    return head.lstrip().startswith(b"{")


def _read(path: Path, gz: bool) -> pl.DataFrame:
    try:
        source: Path | io.BytesIO = path
        if gz:
            with gzip.open(path, "rb") as fh:
                source = io.BytesIO(fh.read())
        frame = pl.read_csv(source, infer_schema_length=0)
    except (pl.exceptions.PolarsError, OSError, EOFError, UnicodeDecodeError) as exc:
        raise ConfigError("--trace", f"cannot read '{path}' as CSV: {exc}", _FIX) from None
    frame = frame.rename({c: c.strip() for c in frame.columns if c != c.strip()})
    if all(c in frame.columns for c in BURSTGPT_COLUMNS):
        return frame
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError("--trace", f"'{path}' lacks column(s) {', '.join(missing)}", _FIX)
    return frame


def _bad(path: Path, line: int, what: str, fix: str) -> ConfigError:
    return ConfigError("--trace", f"bad value in '{path}' line {line}: {what}", fix)


def _tokens_column(frame: pl.DataFrame, name: str, path: Path, fix: str) -> pl.Series:
    """A token-count column as Int64, a missing cell as null; a count written as a float (472.0, as pandas
    writes a column with gaps) is taken, anything else that is not a whole number is refused."""
    raw = frame[name]
    num = raw.cast(pl.Float64, strict=False)
    bad = (num.is_null() & raw.is_not_null()) | ~num.is_finite().fill_null(True)
    bad = bad | (num.is_not_null() & ((num != num.floor()) | (num.abs() > _MAX_TOKENS))).fill_null(False)
    if bad.any():
        i = int(bad.arg_true()[0])
        raise _bad(path, int(frame["line"][i]), f"{name} is '{raw[i]}', not a whole number of tokens", fix)
    return num.cast(pl.Int64)


def _seconds_column(frame: pl.DataFrame, name: str, path: Path, fix: str) -> pl.Series:
    raw = frame[name]
    num = raw.cast(pl.Float64, strict=False)
    bad = num.is_null() | ~num.is_finite().fill_null(False)
    if bad.any():
        i = int(bad.arg_true()[0])
        value = "empty" if raw[i] is None else f"'{raw[i]}'"
        raise _bad(path, int(frame["line"][i]), f"{name} is {value}, not a finite number of seconds", fix)
    return num


def _azure_times(frame: pl.DataFrame, path: Path) -> pl.Series:
    """TIMESTAMP as naive datetimes (ns): every row without a time zone, or every row with one (then each
    is taken to UTC, so the gaps across a clock change stay real); `T` between date and time is fine."""
    raw = frame["TIMESTAMP"].str.replace(r"^(\d{4}-\d{2}-\d{2})T", "${1} ")
    naive = raw.str.to_datetime(_FORMAT, strict=False, time_unit="ns")
    if naive.null_count() == 0:
        return naive
    aware = (raw.str.replace(r"(?i)Z$", "+00:00").str.to_datetime(_FORMAT + "%z", strict=False, time_unit="ns")
             .dt.convert_time_zone("UTC").dt.replace_time_zone(None))
    if aware.null_count() == 0:
        return aware
    line = frame["line"]
    neither = naive.is_null() & aware.is_null()
    if neither.any():
        i = int(neither.arg_true()[0])
        value = "empty" if raw[i] is None else f"'{raw[i]}'"
        raise _bad(path, int(line[i]), f"TIMESTAMP is {value}, not a time", _AZURE_FIX)
    first_naive, first_aware = int(naive.is_not_null().arg_true()[0]), int(aware.is_not_null().arg_true()[0])
    later = max(first_naive, first_aware)
    has = "has a time zone" if later == first_aware else "has none"
    raise _bad(path, int(line[later]), f"TIMESTAMP '{raw[later]}' {has} and line "
               f"{int(line[min(first_naive, first_aware)])}'s does not", "give every timestamp a time zone, or none")


def _azure_offsets(stamps: pl.Series, cells: pl.DataFrame, path: Path) -> pl.Series:
    """Seconds from the first row's time; a row ~290 years or more from it is refused (its nanoseconds would overflow
    and the later of two rows read as billions of seconds earlier)."""
    ns = stamps.dt.epoch("ns")
    apart = (ns.cast(pl.Float64) - float(ns[0])) / 1e9
    far = apart.abs() > _MAX_SPAN_S
    if far.any():
        i = int(far.arg_true()[0])
        years, way = abs(apart[i]) / (365.25 * 86_400), "after" if apart[i] > 0 else "before"
        raise _bad(path, int(cells["line"][i]), f"TIMESTAMP '{cells['TIMESTAMP'][i]}' is {years:,.0f} years {way} "
                   f"line {int(cells['line'][0])}", "check the dates: a trace spans seconds to months")
    return (ns - ns[0]).cast(pl.Float64) / 1e9


def _cells(frame: pl.DataFrame, columns: tuple[str, ...]) -> pl.DataFrame:
    """The columns, stripped, an empty cell as null, with each row's line in the file (the header is line
    1); a blank line (every cell empty) is dropped."""
    frame = frame.select(
        *(pl.col(c).str.strip_chars().pipe(lambda e: pl.when(e != "").then(e)).alias(c) for c in columns),
        pl.int_range(2, pl.len() + 2, dtype=pl.Int64).alias("line"))
    return frame.filter(~pl.all_horizontal(pl.col(c).is_null() for c in columns))


def _parse(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    """(t seconds, prompt, output, line) from either CSV format."""
    if all(c in frame.columns for c in BURSTGPT_COLUMNS):
        cells = _cells(frame, BURSTGPT_COLUMNS)
        return pl.DataFrame({"t": _seconds_column(cells, "Timestamp", path, _BURST_FIX),
                             "prompt": _tokens_column(cells, "Request tokens", path, _BURST_FIX),
                             "output": _tokens_column(cells, "Response tokens", path, _BURST_FIX),
                             "line": cells["line"]})
    cells = _cells(frame, COLUMNS)
    if cells.height == 0:
        return pl.DataFrame(schema={"t": pl.Float64, "prompt": pl.Int64, "output": pl.Int64, "line": pl.Int64})
    return pl.DataFrame({"t": _azure_offsets(_azure_times(cells, path), cells, path),
                         "prompt": _tokens_column(cells, "ContextTokens", path, _AZURE_FIX),
                         "output": _tokens_column(cells, "GeneratedTokens", path, _AZURE_FIX),
                         "line": cells["line"]})


def _number(obj: dict, key: str, path: Path, n: int, whole: bool) -> float:
    value = obj[key]
    try:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError
        num = float(value)
    except ValueError:
        num = math.nan
    if not math.isfinite(num) or (whole and (num != math.floor(num) or abs(num) > _MAX_TOKENS)):
        what = "a whole number of tokens" if whole else "a finite number of milliseconds"
        raise _bad(path, n, f"{key} is {json.dumps(value)}, not {what}", _MOON_FIX)
    return num


def _block_ids(obj: dict, path: Path, n: int) -> tuple[int, ...]:
    ids = obj.get("hash_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise _bad(path, n, f"hash_ids is {json.dumps(ids)[:60]}, not a list of integers", _MOON_FIX)
    return tuple(ids)


def _read_mooncake(path: Path, gz: bool) -> tuple[pl.DataFrame, tuple[tuple[int, ...], ...]]:
    rows: list[tuple[float, int, int, int]] = []
    blocks: list[tuple[int, ...]] = []
    opened = gzip.open(path, "rt", encoding="utf-8-sig") if gz else path.open(encoding="utf-8-sig")
    try:
        with opened as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise ConfigError("--trace", f"'{path}' line {n} is not a Mooncake record (not JSON: {exc})",
                                      _MOON_FIX) from None
                except RecursionError:
                    raise ConfigError("--trace", f"'{path}' line {n} is not a Mooncake record (nested too deeply "
                                      "to read)", _MOON_FIX) from None
                if not isinstance(obj, dict):
                    raise ConfigError("--trace", f"'{path}' line {n} is not a Mooncake record (not a JSON object)",
                                      _MOON_FIX)
                absent = [k for k in MOONCAKE_KEYS if k not in obj]
                if absent:
                    raise ConfigError("--trace", f"'{path}' line {n} is not a Mooncake record (no "
                                      f"{', '.join(absent)})", _MOON_FIX)
                rows.append((_number(obj, "timestamp", path, n, False) / 1e3,
                             int(_number(obj, "input_length", path, n, True)),
                             int(_number(obj, "output_length", path, n, True)), n))
                blocks.append(_block_ids(obj, path, n))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ConfigError("--trace", f"cannot read '{path}' as JSONL: {exc}", _MOON_FIX) from None
    frame = pl.DataFrame(rows, schema={"t": pl.Float64, "prompt": pl.Int64, "output": pl.Int64, "line": pl.Int64},
                         orient="row")
    return frame, tuple(blocks)


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
    gz = _is_gzip(path)
    head = _head(path, gz)
    if not head.strip():
        raise ConfigError("--trace", f"'{path}' is empty", _FIX)
    if _is_jsonl(head):
        whole, all_blocks = _read_mooncake(path, gz)
        kind = "mooncake"
        frame = whole.slice(offset, limit)
        blocks = all_blocks[offset:offset + frame.height]
    else:
        raw = _read(path, gz)
        kind = "burstgpt" if all(c in raw.columns for c in BURSTGPT_COLUMNS) else "azure"
        frame = _parse(raw, path).slice(offset, limit)
    if frame.height == 0:
        where = f"after its first {offset}" if offset else "below its header" if kind != "mooncake" else "in it"
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
    lines = frame["line"].to_numpy()[keep]
    offsets = t - t[0]
    back = np.flatnonzero(np.diff(offsets) < 0)
    if len(back):
        i = int(back[0]) + 1
        column = _TIME_COLUMN[kind]
        raise ConfigError("--trace", f"'{path}' is not sorted by {column}: line {lines[i]} is "
                          f"{offsets[i - 1] - offsets[i]:.6g} s earlier than line {lines[i - 1]}",
                          f"sort it by {column}")
    kept_blocks = None if blocks is None else tuple(b for b, k in zip(blocks, keep, strict=True) if k)
    return Trace(str(path), offsets, prompt[keep], output[keep], kept_blocks, kind, int((~keep).sum()))


def replay(trace: Trace, max_model_len: int, time_scale: float = 1.0,
           output_tokens: int | None = None) -> TraceReplay:
    """Send times = offsets / time_scale (2.0 plays twice as fast); prompts shortened so that
    prompt + output <= max_model_len, outputs to at most max_model_len - 1."""
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ConfigError("--time-scale", f"must be a finite number > 0, got {time_scale}",
                          "2.0 replays twice as fast, 0.5 half as fast")
    out_raw = trace.output_tokens if output_tokens is None else np.full(len(trace), output_tokens)
    out = np.clip(out_raw, 1, max_model_len - 1)
    prompt = np.clip(trace.prompt_tokens, 1, max_model_len - out)
    clipped = (out != out_raw) | (prompt != trace.prompt_tokens)
    return TraceReplay(trace.offsets_s / time_scale, prompt, out, int(clipped.sum()), trace.blocks,
                       invalid_rows=trace.invalid_rows)
