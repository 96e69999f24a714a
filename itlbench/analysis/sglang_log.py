"""SGLang's scheduler log as a further, coarse source on a run's stall events (`analyze --server-log FILE`).

Why: SGLang publishes no step log and no per-request spans, but its scheduler logs one line per prefill
batch it schedules and one per `--decode-log-interval` decode steps (40 by default in recent versions):

    [2025-07-18 15:32:52 TP0] Prefill batch. #new-seq: 1, #new-token: 2192, #cached-token: 35, token usage: 0.00,
        #running-req: 0, #queue-req: 0
    [2025-07-18 15:32:54 TP0] Decode batch. #running-req: 1, #token: 2266, token usage: 0.00, cuda graph: True,
        gen throughput (token/s): 75.25, #queue-req: 0

(one line each; the bracket may hold `TP0 EP0`, a DP rank, or nothing; the fields vary between versions
and only those named here are read). So the log says which prefill batches (how many new and cached
tokens, how many requests queued) the server scheduled around each stall, in its own words.

What it cannot say: the bracketed stamp has **one-second resolution** (some versions append `timestamp:
<ISO time>` with microseconds; that is used where present), in the server's local time without a zone
(read as this host's local time: set TZ when analysing if the server's differed). A prefill line is
written when the batch is scheduled, not when it ends. So the log does not attribute stalls itself: it is
laid beside the client-only attribution's events (client_attribution.py). For each event it lists the
prefill batches logged within [start − resolution, end + resolution] and says whether they carry the
tokens of the prefills the client-only attribution named (`log_agrees`): a second source for the cause,
no finer than a second.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.analysis.wall_clock import WallClockMap
from itlbench.errors import ConfigError

SOURCE = "sglang_log"
_LINE = re.compile(r"\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?: ([^\]]*))?\] (Prefill|Decode) batch\.(.*)$")
_FIELD = re.compile(r"(#?[A-Za-z][\w\- ()/]*?): ([^,]+)")
_INTS = {"#new-seq": "new_seq", "#new-token": "new_tokens", "#cached-token": "cached_tokens",
         "#running-req": "running", "#queue-req": "queued", "#token": "kv_tokens"}
_FLOATS = {"gen throughput (token/s)": "gen_tokens_per_s", "token usage": "token_usage"}
SCHEMA = {"t_ns": pl.Int64, "resolution_s": pl.Float64, "rank": pl.Utf8, "kind": pl.Utf8, "new_seq": pl.Int64,
          "new_tokens": pl.Int64, "cached_tokens": pl.Int64, "running": pl.Int64, "queued": pl.Int64,
          "kv_tokens": pl.Int64, "gen_tokens_per_s": pl.Float64, "token_usage": pl.Float64}


def _epoch_ns(text: str, fmt: str) -> int:
    """A zone-less local time (the server's, taken as this host's) as Unix ns."""
    return int(dt.datetime.strptime(text, fmt).timestamp() * 1e9)  # noqa: DTZ007 - the log has no zone


def parse_line(line: str) -> dict[str, Any] | None:
    """One scheduler batch line as a row (None for any other line)."""
    m = _LINE.search(line)
    if m is None:
        return None
    stamp, rank, kind, rest = m.groups()
    row: dict[str, Any] = dict.fromkeys(SCHEMA)
    fields = {k.strip(): v.strip() for k, v in _FIELD.findall(rest)}
    precise = fields.get("timestamp")
    try:
        row["t_ns"], row["resolution_s"] = (_epoch_ns(precise, "%Y-%m-%dT%H:%M:%S.%f"), 1e-6) if precise and "." in precise \
            else (_epoch_ns(stamp, "%Y-%m-%d %H:%M:%S"), 1.0)
    except (ValueError, OverflowError, OSError):
        try:  # a stamp no calendar has (month 13, year 0): not a line the scheduler wrote
            row["t_ns"], row["resolution_s"] = _epoch_ns(stamp, "%Y-%m-%d %H:%M:%S"), 1.0
        except (ValueError, OverflowError, OSError):
            return None
    row["rank"], row["kind"] = (rank or "").strip(), kind.lower()
    for key, col in _INTS.items():
        if key in fields:
            try:
                value = int(fields[key])
            except ValueError:
                continue
            row[col] = value if 0 <= value < 2**63 else None  # a count no int64 column holds: not one SGLang logs
    for key, col in _FLOATS.items():
        if key in fields:
            try:
                value = float(fields[key])
            except ValueError:
                continue
            row[col] = value if math.isfinite(value) else None
    return row


def parse_log(lines: Iterable[str]) -> pl.DataFrame:
    """Every prefill and decode batch line, in order (Unix ns, the resolution each stamp has)."""
    rows = [r for r in (parse_line(x) for x in lines) if r is not None]
    return pl.DataFrame(rows, schema=SCHEMA).sort("t_ns", maintain_order=True)


def read_log(path: Path) -> pl.DataFrame:
    if not path.is_file():
        raise ConfigError("--server-log", f"{path} " + ("is a directory" if path.is_dir() else "not found"),
                          "pass the file SGLang's server wrote its log to "
                          "(a sweep keeps it as POINT/server.log)")
    with path.open(errors="replace") as f:
        return parse_log(f)


def event_evidence(events: pl.DataFrame, requests: pl.DataFrame, log: pl.DataFrame,
                   origin_ns: int) -> list[dict[str, Any]]:
    """Per event: the prefill batches logged (`log` with its times on the run's clock, `t_run`) within its
    span ± the stamps' resolution, and whether they carry the tokens of the prefills the client-only
    attribution named (`log_agrees`; None when it named none)."""
    pre = log.filter(pl.col("kind") == "prefill")
    tokens = (pl.coalesce("prompt_tokens_reported", "prompt_tokens") - pl.col("cached_tokens_reported").fill_null(0))
    size = requests.select("request_id", "server_request_id", tokens.alias("tokens"))
    sizes: dict[str, Any] = {}
    for rid, sid, n in size.iter_rows():  # an event names a request by either id
        sizes[rid] = n
        if sid is not None:
            sizes[sid] = n
    out = []
    for e in events.sort("start_ns").iter_rows(named=True):
        res = int(float(pre["resolution_s"].max() or 1.0) * 1e9) if pre.height else int(1e9)
        mine = pre.filter((pl.col("t_run") >= e["start_ns"] - res) & (pl.col("t_run") <= e["end_ns"] + res))
        named = [r for r in (e.get("prefill_request_ids") or []) if r in sizes]
        named_tokens = int(sum(int(sizes[r] or 0) for r in named))
        logged = int(mine["new_tokens"].fill_null(0).sum()) if mine.height else 0
        out.append({"event": e["event"], "start_s": (e["start_ns"] - origin_ns) / 1e9,
                    "end_s": (e["end_ns"] - origin_ns) / 1e9, "cause": e.get("cause"),
                    "stalled_s": e.get("stalled_s"), "prefill_batches": mine.height, "new_tokens": logged,
                    "cached_tokens": int(mine["cached_tokens"].fill_null(0).sum()) if mine.height else 0,
                    "max_queued": mine["queued"].max() if mine.height else None,
                    "named_prefill_tokens": named_tokens if named else None,
                    "log_agrees": (logged >= 0.5 * named_tokens) if named else None})
    return out


def analyze_server_log(run_dir: str | Path, log_path: Path) -> dict[str, Any]:
    """server-log.json's content: the log's batches laid beside the client-only attribution's events."""
    from itlbench.analysis.client_summary import windowed_client_stalls
    from itlbench.analysis.stalls import StallParams
    from itlbench.analysis.stats import json_safe
    from itlbench.analysis.summary import _window_from
    from itlbench.rundir import load_tables

    log = read_log(log_path)
    if log.is_empty():
        raise ConfigError("--server-log", f"{log_path} has no `Prefill batch.` or `Decode batch.` line",
                          "pass SGLang's server log (its scheduler writes those lines at the default log level)")
    meta = json.loads(Path(run_dir, "run.json").read_text())
    tables = load_tables(run_dir)
    window, params = _window_from(meta), StallParams.from_meta(meta)
    events = windowed_client_stalls(tables, window, params).report.events
    timed = WallClockMap.of(tables).with_run_column(log, "t_ns", "t_run")
    in_run = timed.filter((pl.col("t_run") >= window.run_start_ns - int(1e9)) & (pl.col("t_run") <= window.end_ns + int(1e9)))
    rows = event_evidence(events, tables["requests"], timed, window.measure_start_ns)
    return json_safe({"source": SOURCE, "log": str(log_path), "lines": log.height,
                      "lines_in_run": in_run.height,
                      "prefill_batches_in_run": int((in_run["kind"] == "prefill").sum()),
                      "decode_lines_in_run": int((in_run["kind"] == "decode").sum()),
                      "resolution_s": float(log["resolution_s"].max()), "ranks": sorted(set(log["rank"].to_list())),
                      "clock": "server local time read as this host's (TZ); mapped to the run's clock by "
                               "client_samples.clock_offset_ns at each line's time",
                      "events_from": "client_inferred (analyze --attribution client)",
                      "agree": sum(1 for r in rows if r["log_agrees"]),
                      "disagree": sum(1 for r in rows if r["log_agrees"] is False),
                      "events": rows})  # type: ignore[return-value]


def summary_line(doc: Mapping[str, Any]) -> str:
    return (f"SGLang log: {doc['prefill_batches_in_run']} prefill batches during the run "
            f"(stamps to {doc['resolution_s']:g} s); of the client-only attribution's events naming a prefill, "
            f"{doc['agree']} have its tokens logged within the stamps' resolution, {doc['disagree']} do not")
