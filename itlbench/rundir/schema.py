"""Record schemas of a run directory: the one definition the writers (load driver, step follower,
run store) and the readers (analysis, reports) share.

All times are integer nanoseconds on the driver's `time.perf_counter_ns()` clock (CLOCK_MONOTONIC
on Linux, the same clock the bundled engine stamps its steps with).
"""

from __future__ import annotations

import dataclasses
import types
import typing

import polars as pl

from itlbench.core.steps import StepRecord
from itlbench.rundir.coerce import as_count, as_int64, coercer, typed_series

_POLARS_OF: dict[object, pl.DataType] = {
    int: pl.Int64(), float: pl.Float64(), str: pl.Utf8(), bool: pl.Boolean(),
    tuple[str, ...]: pl.List(pl.Utf8()),
}


def _column_type(hint: object) -> pl.DataType:
    """Polars type of a dataclass field hint; `X | None` is nullable X (every column is nullable)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    try:
        return _POLARS_OF[hint]
    except KeyError:
        raise TypeError(f"StepRecord field type {hint!r} has no column type; extend _POLARS_OF") from None


def step_schema() -> dict[str, pl.DataType]:
    hints = typing.get_type_hints(StepRecord)
    return {f.name: _column_type(hints[f.name]) for f in dataclasses.fields(StepRecord)}

# One row per request the driver planned and sent (or tried to).
REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Utf8(),            # client-side id, unique within the run
    "server_request_id": pl.Utf8(),     # the `id` field the server streamed back (links to steps)
    "workload": pl.Utf8(),              # catalog name, e.g. "rag"
    "cls": pl.Utf8(),                   # SLO class: the workload name, or "injected"
    "injected": pl.Boolean(),
    "stream": pl.Int64(),               # closed-loop stream index; null for open-loop sends
    "session": pl.Utf8(),               # multi-turn session id (agent); null otherwise
    "turn": pl.Int64(),
    "prompt_tokens": pl.Int64(),        # tokens the driver built the prompt to
    "prompt_tokens_reported": pl.Int64(),  # usage.prompt_tokens from the server; null if absent
    "cached_tokens_reported": pl.Int64(),  # usage.prompt_tokens_details.cached_tokens; null if absent
    "max_tokens": pl.Int64(),
    "scheduled_ns": pl.Int64(),         # when the schedule said to send
    "sent_ns": pl.Int64(),              # when the request was actually written
    "first_token_ns": pl.Int64(),       # first chunk that carried tokens
    "last_token_ns": pl.Int64(),
    "first_answer_ns": pl.Int64(),      # first chunk after any reasoning (content or tool call); null if none
    "reasoning_chunks": pl.Int64(),     # chunks that carried reasoning text (delta.reasoning[_content])
    "server_prompt_ms": pl.Float64(),   # the server's own prompt time (llama.cpp `timings.prompt_ms`); null if absent
    "server_decode_ms": pl.Float64(),   # its generation time (`timings.predicted_ms`)
    "server_decode_tokens": pl.Int64(), # tokens that generation time covers (`timings.predicted_n`)
    "done_ns": pl.Int64(),              # stream ended ([DONE], error or timeout)
    "output_tokens": pl.Int64(),        # tokens counted from content chunks
    "output_tokens_reported": pl.Int64(),  # usage.completion_tokens; null if absent
    "num_chunks": pl.Int64(),           # content chunks received
    "status": pl.Utf8(),                # ok | error | timeout | cancelled
    "http_status": pl.Int64(),
    "error": pl.Utf8(),
    "error_kind": pl.Utf8(),            # http_status | not_sse | bad_json | truncated | closed | no_headers |
                                        # timeout | connection | server_error | cancelled | event_too_large |
                                        # head_too_large | other; null if ok
    "finish_reason": pl.Utf8(),
}

# One row per content chunk (a chunk that carried at least one token).
CHUNK_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Utf8(),
    "index": pl.Int64(),                # 0 = first token chunk
    "t_ns": pl.Int64(),                 # arrival time at the client
    "n_tokens": pl.Int64(),             # tokens carried (token_ids length, else 1)
    "stamp": pl.Utf8(),                 # source of t_ns: "kernel" (socket receive time) | "user" (read returned)
    "t_read_ns": pl.Int64(),            # when the client's read returned (= t_ns for "user" stamps)
    "read_chunks": pl.Int64(),          # content chunks of this request completed by the same read (1 = alone)
}

# One row per engine step (the bundled engine's /v1/steps stream): the columns are StepRecord's
# fields, derived below, so the record and its table cannot drift apart.
STEP_SCHEMA: dict[str, pl.DataType] = step_schema()

# Samples of an external engine's /metrics (vllm:, sglang:, itlbench_), one row per series per scrape.
SERVER_METRIC_SCHEMA: dict[str, pl.DataType] = {
    "t_ns": pl.Int64(),
    "name": pl.Utf8(),
    "labels": pl.Utf8(),                # JSON of the label set
    "value": pl.Float64(),
}

# One row per /metrics scrape of an external engine, whether it succeeded or not: when it ran on the
# client (request sent to body received), so gaps overlapping a scrape can be attributed to it.
SCRAPE_SCHEMA: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(),             # request sent (the server_metrics rows of this scrape carry it as t_ns)
    "end_ns": pl.Int64(),               # body received (parsing happens after the load, off the measurement)
    "reason": pl.Utf8(),                # baseline | final | periodic
    "status": pl.Utf8(),                # ok | error | cancelled (cut by the end of the run)
    "http_status": pl.Int64(),
    "bytes": pl.Int64(),                # size of the exposition
    "series": pl.Int64(),               # engine samples kept (vllm:, sglang:, itlbench_)
    "error": pl.Utf8(),
}

# The driver's own health, sampled periodically: the validity gate reads it.
CLIENT_SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "t_ns": pl.Int64(),
    "loop_lag_s": pl.Float64(),         # event-loop lag: how late a periodic timer fired
    "cpu_percent": pl.Float64(),        # client process CPU, 100 = one core
    "in_flight": pl.Int64(),            # requests open at the sample time
    "clock_offset_ns": pl.Int64(),      # CLOCK_REALTIME − perf_counter_ns at the sample (wall-clock spans map through it)
}

# Intervals in which the client could not have read the network on time: its event loop woke late
# (kind "loop") or Python's garbage collector ran (kind "gc"). Chunks read right after one carry its delay.
CLIENT_PAUSE_SCHEMA: dict[str, pl.DataType] = {
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "kind": pl.Utf8(),                  # loop | gc
    "cpu_s": pl.Float64(),              # loop pauses: the loop thread's on-CPU time in it (Linux schedstat)
    "runq_s": pl.Float64(),             # ... its time runnable but waiting for a CPU (starved by other processes)
}

# The GPU beside the step log (bundled engine on CUDA with nvidia-ml-py): NVML read every 0.1 s on the
# perf_counter clock the steps use. Absent (no folder) where there is no NVML; run.json says why.
GPU_SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "t_ns": pl.Int64(),
    "device": pl.Int64(),               # NVML index
    "power_w": pl.Float64(),
    "sm_util": pl.Float64(),            # % of the sample period a kernel ran
    "mem_util": pl.Float64(),           # % of the period device memory was read or written
    "energy_j": pl.Float64(),           # the device's cumulative counter (null before Volta)
}

TABLES: dict[str, dict[str, pl.DataType]] = {
    "requests": REQUEST_SCHEMA,
    "chunks": CHUNK_SCHEMA,
    "steps": STEP_SCHEMA,
    "server_metrics": SERVER_METRIC_SCHEMA,
    "scrapes": SCRAPE_SCHEMA,
    "client_samples": CLIENT_SAMPLE_SCHEMA,
    "client_pauses": CLIENT_PAUSE_SCHEMA,
    "gpu_samples": GPU_SAMPLE_SCHEMA,
}


def empty(table: str) -> pl.DataFrame:
    return pl.DataFrame(schema=TABLES[table])


def typed_frame(table: str, columns: dict[str, list[object]]) -> tuple[pl.DataFrame, int]:
    """(frame with the table's exact schema, cells coerced). The fast path builds it strictly; a batch
    holding a cell of the wrong type (a peer's doing) is rebuilt column by column, and the cells that
    cannot be made their column's type become null (`coerce.typed_series`) instead of failing the batch."""
    schema = TABLES[table]
    n = len(next(iter(columns.values()), []))
    data = {k: columns.get(k, [None] * n) for k in schema}
    try:
        return pl.DataFrame(data, schema=schema), 0
    except Exception:  # noqa: BLE001 - polars raises several types for one bad cell
        pass
    if any(len(v) != n for v in data.values()):
        raise ValueError(f"{table}: columns of different lengths ({sorted({len(v) for v in data.values()})})")
    built = [typed_series(k, list(data[k]), dtype) for k, dtype in schema.items()]
    return pl.DataFrame([s for s, _ in built]), sum(c for _, c in built)


def columns_frame(table: str, columns: dict[str, list[object]]) -> pl.DataFrame:
    """Columns (missing ones become null) as a frame with the table's exact schema."""
    return typed_frame(table, columns)[0]


def rows_columns(table: str, rows: list[dict[str, object]]) -> dict[str, list[object]]:
    return {k: [r.get(k) for r in rows] for k in TABLES[table]}


def frame(table: str, rows: list[dict[str, object]]) -> pl.DataFrame:
    """Rows (dicts, missing keys become null) as a frame with the table's exact schema."""
    if not rows:
        return empty(table)
    # column-wise construction: ~3x faster than row dicts, and it runs while the load is live
    return typed_frame(table, rows_columns(table, rows))[0]


def coerce_row(table: str, row: object) -> dict[str, object] | None:
    """A row from an untrusted peer (a /v1/steps line, a Locust worker's batch) fit for `table`:
    only its columns; strings str; times (`*_ns`) int64; every other integer a non-negative int64
    count; anything else null. None when the row is not an object at all."""
    if not isinstance(row, dict):
        return None
    out: dict[str, object] = {}
    for name, dtype in TABLES[table].items():
        value = row.get(name)
        if value is None:
            out[name] = None
        elif dtype == pl.Int64():
            out[name] = as_int64(value) if name.endswith("_ns") else as_count(value)
        else:
            out[name] = coercer(dtype)(value)
    return out
