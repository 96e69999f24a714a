"""Stall attribution from vLLM's per-request OpenTelemetry spans (`attribution_source: vllm_otel`).

Why: vLLM publishes no step log, but with `--otlp-traces-endpoint` it exports one `llm_request` span per
finished request whose attributes say, in the server's own clocks, when the request arrived (the span's
start, wall clock), how long it took to its first token (`gen_ai.latency.time_to_first_token`) and how
much of that the engine spent prefilling it (`gen_ai.latency.time_in_model_prefill`: scheduled → first
token, chunks and the decodes they were batched with included). That is each request's prefill window,
measured by the server rather than inferred from the client's stamps:

    prefill window = [arrival + ttft − prefill, arrival + ttft]   (wall clock → the run's clock through
                                                                   client_samples.clock_offset_ns at
                                                                   that moment, wall_clock.py)

Each window becomes one prefill "step" naming its request, and `stalls.analyze_stalls` attributes the
run's stalls on them exactly as it does logged or inferred steps, so the summary has the same fields
(cause, prefill_request_ids, injected_request_ids, …). Spans are matched one to one to the client's requests: by
vLLM's request id where the client recorded the response's id, else by prompt length and arrival time
(the nearest send within `tolerance_s`; both clocks are this host's wall clock).

What the spans cannot say they do not claim: they carry no engine steps, so a stall that no prefill
window explains stays `unknown` (reason `no_steps`) unless the client's own records call it `scrape` or
`client`. An event whose own cause is none of those takes the cause that carries most of its stalled
seconds, by the rule the client-only attribution uses too (event_cause.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.analysis import itl
from itlbench.analysis.client_attribution import client_only, requests_for_attribution
from itlbench.analysis.event_cause import KEPT, event_causes
from itlbench.analysis.stalls import StallParams, analyze_stalls, stall_summary
from itlbench.analysis.stats import json_safe
from itlbench.analysis.wall_clock import WallClockMap
from itlbench.analysis.window import RunWindow, select_window
from itlbench.errors import ConfigError

SOURCE = "vllm_otel"
SPANS_FILE = "otel_spans.jsonl"
SPAN_NAME = "llm_request"
_TTFT = "gen_ai.latency.time_to_first_token"
_PREFILL = "gen_ai.latency.time_in_model_prefill"
_QUEUE = "gen_ai.latency.time_in_queue"
_PROMPT = "gen_ai.usage.prompt_tokens"
_ID = "gen_ai.request.id"
_WINDOWS = {"span_id": pl.Utf8, "arrival_ns": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
            "prompt_tokens": pl.Int64, "queue_s": pl.Float64, "prefill_s": pl.Float64}


def write_spans(path: Path, spans: Iterable[Mapping[str, Any]]) -> int:
    """Spans as the OTLP receiver decodes them, one JSON object a line; returns how many."""
    n = 0
    with path.open("w") as f:
        for span in spans:
            f.write(json.dumps(span, default=str) + "\n")
            n += 1
    return n


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans `write_spans` wrote; a line that is not a JSON object is a ConfigError naming it."""
    spans = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            span = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: arrays nested thousands deep
            span = exc
        if not isinstance(span, dict):
            raise ConfigError("--spans", f"{path} line {n} is not a JSON object",
                              "pass the spans file an OTLP receiver wrote (one JSON object a line)")
        spans.append(span)
    return spans


def run_bounds(run_dir: str | Path, margin_s: float = 1.0) -> tuple[int, int]:
    """The wall-clock span [run start, run end + `margin_s`] in which the run's requests arrived (ns)."""
    from itlbench.rundir.reader import read_table

    meta = json.loads(Path(run_dir, "run.json").read_text())
    clock = WallClockMap.of({"client_samples": read_table(run_dir, "client_samples")})
    lo = int(meta.get("run_start_ns") or 0)
    hi = int(meta.get("end_ns") or 2**62) + int(margin_s * 1e9)
    return clock.to_wall(lo), clock.to_wall(hi)


def spans_for_run(run_dir: str | Path, spans: Iterable[Mapping[str, Any]], margin_s: float = 1.0) -> list[dict[str, Any]]:
    """The spans of requests that arrived during the run (from its start, before which only itlbench's
    start-up probes are sent, to its end + `margin_s`), for a receiver that served several runs (a sweep's points)."""
    lo, hi = run_bounds(run_dir, margin_s)
    starts = [(s, _stamp_ns(s.get("start_ns") or 0)) for s in spans]
    return [dict(s) for s, ns in starts if ns is not None and lo <= ns <= hi]


MAX_SPAN_S = 86_400.0  # a latency attribute beyond a day is not one a request had


def _seconds(value: object) -> float | None:
    """A span's latency attribute in seconds: a finite number within a day, else None (the server's data)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and abs(value) <= MAX_SPAN_S:
        return float(value)
    return None


def _stamp_ns(value: object) -> int | None:
    """A span's start (Unix ns): an integer an int64 holds, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63 else None


def prefill_windows(spans: Iterable[Mapping[str, Any]], clock: WallClockMap) -> pl.DataFrame:
    """One row per `llm_request` span with a first token: its prefill window in the run's clock."""
    rows = []
    for s in spans:
        a = s.get("attributes")
        a = a if isinstance(a, Mapping) else {}
        ttft, prefill, wall = _seconds(a.get(_TTFT)), _seconds(a.get(_PREFILL)), _stamp_ns(s.get("start_ns"))
        if s.get("name") != SPAN_NAME or ttft is None or prefill is None or wall is None:
            continue  # a span without its timings (or with text, NaN or a year of prefill in their place)
        prompt = a.get(_PROMPT)
        rows.append({"span_id": str(a.get(_ID) or s.get("span_id")), "wall_ns": wall, "ttft_ns": int(ttft * 1e9),
                     "prefill_ns": int(max(prefill, 0.0) * 1e9),
                     "prompt_tokens": prompt if isinstance(prompt, int) and not isinstance(prompt, bool)
                     and 0 <= prompt < 2**62 else 0, "queue_s": _seconds(a.get(_QUEUE)) or 0.0, "prefill_s": prefill})
    if not rows:
        return pl.DataFrame(schema=_WINDOWS)
    spans_df = clock.with_run_column(pl.DataFrame(rows), "wall_ns", "arrival_ns")  # one mapping for all spans
    first = pl.col("arrival_ns") + pl.col("ttft_ns")
    return (spans_df.with_columns((first - pl.col("prefill_ns")).alias("start_ns"), first.alias("end_ns"))
            .select(list(_WINDOWS)).cast(_WINDOWS).sort("arrival_ns"))


def _by_id(span_id: str, ids: dict[str, int]) -> int | None:
    """The client row whose server id is the span's request id, or its prefix (vLLM appends `-<choice>`)."""
    if span_id in ids:
        return ids[span_id]
    head = span_id.rsplit("-", 1)[0]
    return ids.get(head)


def match_requests(windows: pl.DataFrame, requests: pl.DataFrame, tolerance_s: float = 1.0) -> pl.DataFrame:
    """Windows joined one to one to the client's requests: by the server's request id where the client
    recorded it, else the unmatched request of the same reported prompt length sent nearest (within
    `tolerance_s`); windows matching nothing are dropped. Adds `matched_by` (id or time)."""
    tokens = pl.coalesce(*[pl.col(c).cast(pl.Int64) for c in ("prompt_tokens_reported", "prompt_tokens")
                           if c in requests.columns])
    extra = [c for c in ("cached_tokens_reported",) if c in requests.columns]
    client = (requests_for_attribution(requests).drop_nulls("sent_ns")
              .select("request_id", "server_request_id", "sent_ns", tokens.alias("client_prompt_tokens"), *extra)
              .sort("sent_ns"))
    rows = client.to_dicts()
    ids = {str(r["server_request_id"]): i for i, r in enumerate(rows) if r["server_request_id"] is not None}
    taken: set[int] = set()
    picks: list[tuple[int, int, str]] = []
    tol = int(tolerance_s * 1e9)
    for w, win in enumerate(windows.sort("arrival_ns").to_dicts()):
        i = _by_id(win["span_id"], ids)
        how = "id"
        if i is None or i in taken:
            near = [(abs(r["sent_ns"] - win["arrival_ns"]), j) for j, r in enumerate(rows)
                    if j not in taken and r["client_prompt_tokens"] == win["prompt_tokens"]
                    and abs(r["sent_ns"] - win["arrival_ns"]) <= tol]
            i, how = (min(near)[1], "time") if near else (None, "")
        if i is not None:
            taken.add(i)
            picks.append((w, i, how))
    if not picks:
        return windows.clear().join(client.clear(), how="cross").with_columns(
            pl.lit(None, dtype=pl.Float64).alias("arrival_minus_sent_ms"), pl.lit(None, dtype=pl.Utf8).alias("matched_by"))
    left = windows.sort("arrival_ns")[[w for w, _, _ in picks]]
    right = client[[i for _, i, _ in picks]]
    return pl.concat([left, right], how="horizontal").with_columns(
        ((pl.col("arrival_ns") - pl.col("sent_ns")) / 1e6).alias("arrival_minus_sent_ms"),
        pl.Series("matched_by", [h for _, _, h in picks], dtype=pl.Utf8))


def span_steps(matched: pl.DataFrame) -> pl.DataFrame:
    """The prefill windows in the step log's columns (one prefill step each, no decode steps)."""
    cached = pl.col("cached_tokens_reported").fill_null(0) if "cached_tokens_reported" in matched.columns \
        else pl.lit(0)
    return matched.sort("start_ns").with_row_index("step").select(
        pl.col("step").cast(pl.Int64), pl.lit("prefill").alias("phase"), "start_ns", "end_ns",
        pl.lit(0, dtype=pl.Int64).alias("decode_tokens"),
        (pl.col("prompt_tokens") - cached).clip(lower_bound=0).cast(pl.Int64).alias("prefill_tokens"),
        pl.concat_list(pl.col("server_request_id")).alias("prefill_request_ids"),
        pl.concat_list(pl.col("server_request_id")).alias("first_token_request_ids"),
        pl.lit(0, dtype=pl.Int64).alias("num_preemptions"))


def _unexplained(frame: pl.DataFrame) -> pl.DataFrame:
    if frame.is_empty():
        return frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias("unknown_reason"))
    kept = pl.col("cause").is_in(KEPT).fill_null(False)
    return frame.with_columns(pl.when(kept).then(pl.col("cause")).otherwise(pl.lit("unknown")).alias("cause"),
                              pl.when(kept).then(pl.lit(None, dtype=pl.Utf8)).otherwise(pl.lit("no_steps"))
                              .alias("unknown_reason"))


def otel_stalls(tables: Mapping[str, pl.DataFrame], window: RunWindow, spans: list[dict[str, Any]],
                params: StallParams | None = None, tolerance_s: float = 1.0) -> dict[str, object]:
    """The `stalls` section from vLLM's spans (module docstring), with what the matching found."""
    return otel_report(tables, window, spans, params, tolerance_s)[1]


def otel_events(tables: Mapping[str, pl.DataFrame], window: RunWindow, spans: list[dict[str, Any]],
                params: StallParams | None = None, tolerance_s: float = 1.0) -> pl.DataFrame:
    """Every stall event attributed on vLLM's spans (the summary lists only the top ones)."""
    return otel_report(tables, window, spans, params, tolerance_s)[0]


def otel_report(tables: Mapping[str, pl.DataFrame], window: RunWindow, spans: list[dict[str, Any]],
                params: StallParams | None = None, tolerance_s: float = 1.0) -> tuple[pl.DataFrame, dict[str, object]]:
    """(events, the `stalls` summary) from vLLM's spans."""
    params = params or StallParams()
    t = select_window(client_only(tables), window)
    clock = WallClockMap.of(tables)
    windows = prefill_windows(spans, clock)
    matched = match_requests(windows, t["all_requests"], tolerance_s)
    steps = span_steps(matched)
    gaps = itl.gap_table(t["all_chunks"], t["all_requests"]).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    base = analyze_stalls(itl.steady(gaps), steps, requests_for_attribution(t["all_requests"]), params,
                          window.measure_start_ns, t["client_pauses"], t["scrapes"])
    stalls = _unexplained(base.stalls)
    events = event_causes(base.events, stalls)  # the rule every source shares (event_cause.py)
    summary = stall_summary(stalls, events, steps, params, window.measure_start_ns)
    summary["attribution_source"] = SOURCE if steps.height else "unavailable"
    err = matched["arrival_minus_sent_ms"].abs() if matched.height else pl.Series([], dtype=pl.Float64)
    lag = matched["arrival_minus_sent_ms"] if matched.height else pl.Series([], dtype=pl.Float64)
    summary["spans"] = {"received": len(spans), "with_first_token": windows.height, "matched": matched.height,
                        "clock_offset_ns": clock.base_ns, "clock_drift_ms": clock.drift_ns / 1e6,
                        "arrival_minus_sent_ms_max": err.max() if err.len() else None,
                        "arrival_minus_sent_ms": {"min": lag.min(), "p50": lag.median(), "max": lag.max()}
                        if lag.len() else None,
                        "matched_by_id": int((matched["matched_by"] == "id").sum()) if matched.height else 0,
                        "match": f"server request id, else same prompt tokens and nearest send within {tolerance_s:g} s"}
    summary["unknown_reasons"] = {"no_steps": "no prefill window of vLLM's spans covers half of it (spans carry "
                                              "no engine steps)"}
    inj = t["all_requests"].filter(pl.col("injected").fill_null(False)).select("request_id")
    summary["injected_prefills"] = json_safe(
        matched.join(inj, on="request_id", how="semi")
        .select("request_id", "span_id", "prompt_tokens", "queue_s", "prefill_s", "arrival_minus_sent_ms",
                ((pl.col("start_ns") - window.measure_start_ns) / 1e9).alias("prefill_start_s"),
                ((pl.col("end_ns") - window.measure_start_ns) / 1e9).alias("prefill_end_s")).to_dicts())
    return events, json_safe(summary)  # type: ignore[return-value]


def analyze_run_otel(run_dir: str | Path, spans_path: Path | None = None) -> dict[str, object]:
    """summary-otel.json's content: the client-only summary with `stalls` from vLLM's spans."""
    from itlbench.analysis.client_summary import analyze_run_client
    from itlbench.analysis.summary import _window_from
    from itlbench.errors import ConfigError
    from itlbench.rundir import load_tables

    path = spans_path or Path(run_dir, SPANS_FILE)
    if not path.is_file():
        raise ConfigError("--spans", f"{path} " + ("is a directory" if path.is_dir() else "not found"),
                          "save the OTLP receiver's spans there "
                          "(itlbench.analysis.otel_attribution.write_spans), or pass --spans FILE")
    out = analyze_run_client(run_dir)  # reads and checks run.json first (analysis/run_doc.py)
    meta = json.loads(Path(run_dir, "run.json").read_text())
    out["stalls"] = otel_stalls(load_tables(run_dir), _window_from(meta), read_spans(path), StallParams.from_meta(meta))
    out["attribution"] = {"source": SOURCE, "inputs": ["requests", "chunks", "client_pauses", "scrapes",
                                                       str(path.name)], "ignored": ["steps", "server_metrics"]}
    return out
