"""Stalls: gaps far longer than their own stream's rhythm, and which prefill caused them.

A gap (see itl.py) is a stall when gap ≥ max(factor × median gap of its request, floor_s).
  stalled_s  Σ of the whole stalled gaps (not the excess over the median)
  worst_s    the longest stalled gap
  victims    distinct requests with at least one stall (requests, not streams: a closed-loop stream
             sends many requests in a window)
stalled_s sums gaps over streams, so it is in stream-seconds and can exceed the window's length.
A gap still open when the window closes (the stream stopped and never resumed, or was cancelled, timed
out or cut while waiting) is judged like the others, from its last token to the window's end or the
cut, whichever came first (itl.open_gap_table; `open` marks it, its length is a lower bound). Every
stall has one cause: `unknown` (with `unknown_reason`) where nothing explains it.
An *event* is a cluster of stalls whose gaps [t_prev, t_next] overlap (transitively, across
streams): one engine hiccup seen by many streams. Attribution of an interval [lo, hi] (a stall's
gap, or an event's span): engine steps with prefill tokens > 0 overlapping it, their prefill
tokens (whole steps), prefill_s (Σ of the parts of those steps inside the interval), and the
requests they prefilled (server ids mapped back to client request ids; injected ones listed).
Needs the engine step log; without it attribution is empty and the source is "unavailable".
Two causes need no step log: `client` (the client's own pauses) and `scrape` (a /metrics scrape of an
external engine was under way for at least half the gap, and the client was not starved of CPU for
half of it: the observer, not the engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from itlbench.analysis.stats import json_safe, ns_to_s

STR_LIST = pl.List(pl.Utf8)


@dataclass(frozen=True)
class StallParams:
    """factor × the request's median gap, but never below floor_s (tiny medians make noise stalls)."""

    factor: float = 5.0
    floor_s: float = 0.05
    top_events: int = 10

    @classmethod
    def from_meta(cls, meta: Mapping[str, object]) -> StallParams:
        """The rule a run was recorded with (its run.json's `stall_factor`, `stall_floor_s`), defaults where absent."""
        factor, floor = meta.get("stall_factor"), meta.get("stall_floor_s")
        return cls(factor=float(factor) if factor is not None else cls.factor,  # type: ignore[arg-type]
                   floor_s=float(floor) if floor is not None else cls.floor_s)  # type: ignore[arg-type]

    def rule(self) -> str:
        """The rule in words, for a reader who sees a high p99 and no stall."""
        return f"a gap of at least {self.factor:g}x the median gap of its stream and at least {self.floor_s * 1e3:g} ms"


@dataclass(frozen=True)
class StallReport:
    stalls: pl.DataFrame
    events: pl.DataFrame
    summary: dict[str, object]


def find_stalls(gaps: pl.DataFrame, params: StallParams) -> pl.DataFrame:
    """The stalled gaps, with the median and threshold that flagged them. The median is of the closed
    gaps only: an open gap (see itl.open_gap_table) is censored, no sample of the stream's rhythm."""
    if "open" not in gaps.columns:
        gaps = gaps.with_columns(pl.lit(False).alias("open"), pl.lit(False).alias("censored"))
    return (
        gaps.with_columns(pl.col("gap_s").filter(~pl.col("open")).median().over("request_id").alias("median_gap_s"))
        .with_columns(
            pl.max_horizontal(pl.col("median_gap_s") * params.factor, pl.lit(params.floor_s)).alias(
                "threshold_s"
            )
        )
        .filter(pl.col("gap_s") >= pl.col("threshold_s"))
        .sort("t_prev_ns", "request_id")
    )


def cluster_events(stalls: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Label each stall with an event id (interval merge on t_prev_ns order) and list the events."""
    labelled = stalls.sort("t_prev_ns", "t_ns").with_columns(
        (pl.col("t_prev_ns") >= pl.col("t_ns").cum_max().shift(1))
        .fill_null(True)
        .cum_sum()
        .cast(pl.Int64)
        .sub(1)
        .alias("event")
    )
    events = (
        labelled.group_by("event")
        .agg(
            pl.col("t_prev_ns").min().alias("start_ns"),
            pl.col("t_ns").max().alias("end_ns"),
            pl.len().cast(pl.Int64).alias("stalls"),
            pl.col("request_id").n_unique().cast(pl.Int64).alias("victims"),
            pl.col("gap_s").max().alias("worst_s"),
            pl.col("gap_s").sum().alias("stalled_s"),
            *_stamp_aggregates(stalls),
        )
        .sort("event")
    )
    return labelled, events


def _stamp_aggregates(stalls: pl.DataFrame) -> list[pl.Expr]:
    """An event is kernel-stamped when all its gaps are; its late bound is their largest."""
    if "stamp" not in stalls.columns:
        return []
    return [pl.when((pl.col("stamp") == "kernel").all()).then(pl.lit("kernel")).otherwise(pl.lit("user"))
            .alias("stamp"), pl.col("late_bound_ns").max().alias("late_bound_ns")]


def _clip_client_pause(frame: pl.DataFrame) -> pl.DataFrame:
    """A kernel receive stamp does not move while the client is paused: only a stamp shared with later
    bytes (see itl.py, late_bound_ns) can be bent, and by no more than its bound."""
    if "stamp" not in frame.columns:
        return frame
    bound = ns_to_s(pl.col("late_bound_ns").fill_null(0))
    return frame.with_columns(
        pl.when(pl.col("stamp") == "kernel").then(pl.min_horizontal("client_pause_s", bound))
        .otherwise(pl.col("client_pause_s")).alias("client_pause_s"))


def _request_map(requests: pl.DataFrame) -> pl.DataFrame:
    return (
        requests.select(
            "server_request_id",
            pl.col("request_id").alias("client_id"),
            pl.col("injected").fill_null(False).alias("client_injected"),
        )
        .drop_nulls("server_request_id")
        .unique("server_request_id", keep="first")
    )


def _overlapping_any(intervals: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per interval: the longest engine step overlapping it and the preemptions in those steps."""
    all_steps = steps.select("start_ns", "end_ns", pl.col("num_preemptions").fill_null(0))
    return (
        intervals.join_where(all_steps, pl.col("start_ns") < pl.col("hi_ns"), pl.col("end_ns") > pl.col("lo_ns"))
        .group_by("id")
        .agg(ns_to_s(pl.col("end_ns") - pl.col("start_ns")).max().alias("longest_step_s"),
             pl.col("num_preemptions").sum().cast(pl.Int64).alias("preemptions"))
    )


def with_cause(frame: pl.DataFrame, worst: str, span: pl.Expr) -> pl.DataFrame:
    """Why a stall (event) happened, read off the steps, scrapes and client pauses that overlapped it:
    prefill — prefill steps fill at least half of it; scrape — a /metrics scrape of the engine covered
    at least half its worst gap and the client was not waiting for a CPU for half of it (the client
    worked on the scrape or the server answered it: the observer's doing, neither the client's nor the
    engine's; a client starved of CPU stretches a scrape, and that stays `client`, see
    analysis/starvation.py); client — the client itself could not read for
    at least half its worst gap (a garbage collection, a blocked event loop: a measurement artifact,
    not the server's; a kernel-stamped gap only as far as its stamps' late bound); preemption — a request was preempted in it;
    engine — one step lasted at least half its worst gap; outside_engine — the engine kept stepping
    in short steps, so the delay arose in the server's HTTP layer, the network or the client."""
    longest = pl.col("longest_step_s")
    return frame.with_columns(
        pl.when(pl.col("prefill_s").fill_null(0.0) >= 0.5 * span).then(pl.lit("prefill"))
        .when((_or_zero(frame, "scrape_s") >= 0.5 * pl.col(worst))
              & (_or_zero(frame, "client_starved_s") < 0.5 * pl.col(worst))).then(pl.lit("scrape"))
        .when(pl.col("client_pause_s").fill_null(0.0) >= 0.5 * pl.col(worst)).then(pl.lit("client"))
        .when(longest.is_null()).then(pl.lit(None, dtype=pl.Utf8))
        .when(pl.col("preemptions").fill_null(0) > 0).then(pl.lit("preemption"))
        .when(longest >= 0.5 * pl.col(worst)).then(pl.lit("engine"))
        .otherwise(pl.lit("outside_engine"))
        .alias("cause")
    )


def _or_zero(frame: pl.DataFrame, column: str) -> pl.Expr:
    return pl.col(column).fill_null(0.0) if column in frame.columns else pl.lit(0.0)


def _overlapping_prefill(intervals: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    prefill = steps.filter(pl.col("prefill_tokens") > 0).select(
        "step", "start_ns", "end_ns", "prefill_tokens", "prefill_request_ids"
    )
    return intervals.join_where(
        prefill, pl.col("start_ns") < pl.col("hi_ns"), pl.col("end_ns") > pl.col("lo_ns")
    ).with_columns(
        ns_to_s(pl.min_horizontal("end_ns", "hi_ns") - pl.max_horizontal("start_ns", "lo_ns")).alias(
            "overlap_s"
        )
    )


def attribute(intervals: pl.DataFrame, steps: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """Per interval (columns id, lo_ns, hi_ns): prefill_steps, prefill_tokens, prefill_s,
    prefill_request_ids, injected_request_ids, injected_prefill."""
    hits = _overlapping_prefill(intervals.select("id", "lo_ns", "hi_ns"), steps)
    totals = hits.group_by("id").agg(
        pl.len().cast(pl.Int64).alias("prefill_steps"),
        pl.col("prefill_tokens").sum().alias("prefill_tokens"),
        pl.col("overlap_s").sum().alias("prefill_s"),
    )
    ids = (
        hits.select("id", pl.col("prefill_request_ids").alias("server_request_id"))
        .explode("server_request_id")
        .drop_nulls("server_request_id")
        .join(_request_map(requests), on="server_request_id", how="left")
        .with_columns(
            pl.coalesce("client_id", "server_request_id").alias("rid"),
            pl.col("client_injected").fill_null(False),
        )
        .group_by("id")
        .agg(
            pl.col("rid").unique().sort().alias("prefill_request_ids"),
            pl.col("rid").filter(pl.col("client_injected")).unique().sort().alias("injected_request_ids"),
        )
    )
    return (
        intervals.select("id")
        .join(totals, on="id", how="left")
        .join(ids, on="id", how="left")
        .join(_overlapping_any(intervals.select("id", "lo_ns", "hi_ns"), steps), on="id", how="left")
        .with_columns(
            pl.col("prefill_steps").fill_null(0),
            pl.col("prefill_tokens").fill_null(0),
            pl.col("prefill_s").fill_null(0.0),
            pl.col("prefill_request_ids").fill_null(pl.lit([], dtype=STR_LIST)),
            pl.col("injected_request_ids").fill_null(pl.lit([], dtype=STR_LIST)),
        )
        .with_columns((pl.col("injected_request_ids").list.len() > 0).alias("injected_prefill"))
    )


def _attach(
    frame: pl.DataFrame, key: str, lo: str, hi: str, steps: pl.DataFrame, requests: pl.DataFrame
) -> pl.DataFrame:
    intervals = frame.select(pl.col(key).alias("id"), pl.col(lo).alias("lo_ns"), pl.col(hi).alias("hi_ns"))
    return frame.join(attribute(intervals, steps, requests).rename({"id": key}), on=key, how="left")


def steps_reaching(all_steps: pl.DataFrame, gaps: pl.DataFrame, lo_ns: int, hi_ns: int) -> pl.DataFrame:
    """The window's steps and those before it that can explain its stalls: a gap that closed in the window
    may have opened before it, and the steps that held it then are outside the window's own (a prefill
    ending exactly at the window's start left such gaps with no step and no cause). With no gap, the
    window's steps alone (whether the run has a step log is the same answer either way)."""
    if all_steps.is_empty():
        return all_steps
    lo = min(lo_ns, int(gaps["t_prev_ns"].min())) if gaps.height else lo_ns  # type: ignore[arg-type]
    return all_steps.filter((pl.col("end_ns") > lo) & (pl.col("start_ns") < hi_ns))


_NO_INTERVALS = {"start_ns": pl.Int64, "end_ns": pl.Int64}


def analyze_stalls(
    gaps: pl.DataFrame, steps: pl.DataFrame, requests: pl.DataFrame, params: StallParams, origin_ns: int = 0,
    pauses: pl.DataFrame | None = None, scrapes: pl.DataFrame | None = None,
) -> StallReport:
    """Stalls and events with attribution, plus the summary dict (times in events relative to origin_ns).
    `pauses` (client_pauses rows) lets a gap the client itself caused be told apart, `scrapes`
    (scrapes rows) one that a /metrics scrape was under way for."""
    return analyze_found_stalls(find_stalls(gaps, params), steps, requests, params, origin_ns, pauses, scrapes)


def analyze_found_stalls(
    found: pl.DataFrame, steps: pl.DataFrame, requests: pl.DataFrame, params: StallParams, origin_ns: int = 0,
    pauses: pl.DataFrame | None = None, scrapes: pl.DataFrame | None = None,
) -> StallReport:
    """`analyze_stalls` from stalls already found (find_stalls rows, in its order): a stall needs only its
    own stream's gaps, so a large run finds them request by request (analysis/scale.py)."""
    pauses = pauses if pauses is not None else pl.DataFrame(schema=_NO_INTERVALS)
    scrapes = scrapes if scrapes is not None else pl.DataFrame(schema=_NO_INTERVALS)
    stalls, events = cluster_events(found.with_row_index("stall"))
    stalls = _attach(
        stalls.with_columns(pl.col("stall").cast(pl.Int64)), "stall", "t_prev_ns", "t_ns", steps, requests
    )
    starved = _starved(pauses)
    stalls = _with_overlap(_with_overlap(stalls, "t_prev_ns", "t_ns", pauses, "client_pause_s"),
                           "t_prev_ns", "t_ns", scrapes, "scrape_s")
    stalls = _with_overlap(stalls, "t_prev_ns", "t_ns", starved, "client_starved_s")
    stalls = with_unknown(with_cause(_clip_client_pause(stalls), "gap_s", pl.col("gap_s")), steps)
    events = _attach(events, "event", "start_ns", "end_ns", steps, requests)
    events = _with_overlap(_with_overlap(events, "start_ns", "end_ns", pauses, "client_pause_s"),
                           "start_ns", "end_ns", scrapes, "scrape_s")
    events = _clip_client_pause(_with_overlap(events, "start_ns", "end_ns", starved, "client_starved_s"))
    events = with_unknown(with_cause(events, "worst_s", ns_to_s(pl.col("end_ns") - pl.col("start_ns"))), steps)
    return StallReport(stalls, events, stall_summary(stalls, events, steps, params, origin_ns))


UNKNOWN_REASONS = {"no_step_log": "the engine published no step log, and neither the client's pauses nor a "
                                  "scrape explain it",
                   "no_steps": "no logged engine step overlaps it (e.g. a gap that began before the first step "
                               "the log holds)"}


def with_unknown(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Every stall (event) in exactly one cause: what `with_cause` left unexplained is `unknown`, and
    `unknown_reason` says why, so by_cause sums to the totals."""
    reason = "no_step_log" if steps.is_empty() else "no_steps"
    unexplained = pl.col("cause").is_null()
    return frame.with_columns(
        pl.when(unexplained).then(pl.lit(reason)).otherwise(pl.lit(None, dtype=pl.Utf8)).alias("unknown_reason"),
        pl.col("cause").fill_null("unknown"))


def _starved(pauses: pl.DataFrame) -> pl.DataFrame:
    """The client pauses spent mostly waiting for a CPU (run-queue time ≥ half the pause)."""
    if "runq_s" not in pauses.columns:
        return pl.DataFrame(schema=_NO_INTERVALS)
    return pauses.filter(pl.col("runq_s").fill_null(0.0) >= 0.5 * (pl.col("end_ns") - pl.col("start_ns")) / 1e9
                         ).select("start_ns", "end_ns")


def _with_overlap(frame: pl.DataFrame, lo: str, hi: str, intervals: pl.DataFrame, name: str) -> pl.DataFrame:
    """`name`: seconds of each [lo, hi] covered by `intervals` (client pauses: the client unable to
    read, gc or a blocked loop; scrapes: a /metrics request under way)."""
    keyed = frame.with_row_index("_row").select("_row", pl.col(lo).alias("lo_ns"), pl.col(hi).alias("hi_ns"))
    overlap = (
        keyed.join_where(intervals.select("start_ns", "end_ns").drop_nulls(), pl.col("start_ns") < pl.col("hi_ns"),
                         pl.col("end_ns") > pl.col("lo_ns"))
        .group_by("_row")
        .agg(ns_to_s(pl.min_horizontal("end_ns", "hi_ns") - pl.max_horizontal("start_ns", "lo_ns"))
             .sum().alias(name))
    )
    return (frame.with_row_index("_row").join(overlap, on="_row", how="left")
            .with_columns(pl.col(name).fill_null(0.0)).drop("_row"))


def event_records(events: pl.DataFrame, limit: int, origin_ns: int) -> list[dict[str, object]]:
    """The top events as plain dicts, the most stream-seconds stalled first: 30 streams frozen 3.5 s by
    a long prefill outrank 31 streams held 0.3 s by a mixed step (a count of streams alone did not)."""
    top = events.sort(["stalled_s", "victims", "start_ns"], descending=[True, True, False]).head(limit)
    rows = top.select(
        "event",
        ns_to_s(pl.col("start_ns") - origin_ns).alias("start_s"),
        ns_to_s(pl.col("end_ns") - pl.col("start_ns")).alias("span_s"),
        "stalls",
        "victims",
        "worst_s",
        "stalled_s",
        "prefill_steps",
        "prefill_tokens",
        "prefill_s",
        "injected_prefill",
        "prefill_request_ids",
        "injected_request_ids",
        "longest_step_s",
        "preemptions",
        "client_pause_s",
        "scrape_s",
        "cause",
        *[c for c in ("unknown_reason", "open") if c in top.columns],
    ).to_dicts()
    return json_safe(rows)  # type: ignore[return-value]


def stall_summary(
    stalls: pl.DataFrame, events: pl.DataFrame, steps: pl.DataFrame, params: StallParams, origin_ns: int
) -> dict[str, object]:
    """The stall figures; `stalled_s` is in stream-seconds, `victims` counts requests."""
    n = stalls.height
    return json_safe(
        {
            "count": n,
            "stalled_s": float(stalls["gap_s"].sum()) if n else 0.0,
            "stalled_unit": "stream-seconds (gaps summed over streams)",
            "worst_s": stalls["gap_s"].max() if n else None,
            "victims": stalls["request_id"].n_unique() if n else 0,
            "events": events.height,
            "events_with_injected_prefill": int(events["injected_prefill"].sum()) if events.height else 0,
            "attribution_source": "engine_steps" if steps.height else "unavailable",
            "victims_unit": "requests",
            "open": open_summary(stalls),
            "by_cause": _by_cause(stalls),
            "by_unknown_reason": by_unknown_reason(stalls),
            "overlapping_scrape": int((stalls["scrape_s"] > 0).sum()) if n and "scrape_s" in stalls.columns else 0,
            "attribution": event_records(events, params.top_events, origin_ns),
            "params": {"factor": params.factor, "floor_s": params.floor_s},
        }
    )  # type: ignore[return-value]


def _by_cause(stalls: pl.DataFrame) -> dict[str, dict[str, float | int]]:
    """Stall count and stalled seconds per cause (causes other than client and scrape need the step log)."""
    if stalls.is_empty() or "cause" not in stalls.columns:
        return {}
    rows = stalls.with_columns(pl.col("cause").fill_null("unknown")).group_by("cause").agg(pl.len().alias("count"), pl.col("gap_s").sum())
    return {r["cause"]: {"count": int(r["count"]), "stalled_s": float(r["gap_s"])} for r in rows.to_dicts()}


def by_unknown_reason(stalls: pl.DataFrame) -> dict[str, dict[str, float | int]]:
    """Count and stalled seconds of the `unknown` stalls per reason (what the attribution lacked)."""
    if stalls.is_empty() or "unknown_reason" not in stalls.columns:
        return {}
    rows = (stalls.filter(pl.col("cause") == "unknown").drop_nulls("unknown_reason").group_by("unknown_reason")
            .agg(pl.len().alias("count"), pl.col("gap_s").sum()))
    return {r["unknown_reason"]: {"count": int(r["count"]), "stalled_s": float(r["gap_s"])} for r in rows.to_dicts()}


def open_summary(stalls: pl.DataFrame) -> dict[str, float | int]:
    """Stalls no token closed: the stream stopped and was cut, or was still stalled when the window closed
    (`at_window_end`, censored there: its length is a lower bound)."""
    if stalls.is_empty() or "open" not in stalls.columns:
        return {"count": 0, "stalled_s": 0.0, "at_window_end": 0}
    opened = stalls.filter(pl.col("open"))
    return {"count": opened.height, "stalled_s": float(opened["gap_s"].sum()) if opened.height else 0.0,
            "at_window_end": int(opened["censored"].sum()) if opened.height else 0}
