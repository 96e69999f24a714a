"""Engine steps reconstructed from the client's records alone (no step log, no server telemetry).

Why it works: an engine step commits one token to every request it ran, and the server writes them
out together, so across streams the chunks' kernel receive stamps come in tight clusters, one per step
(tens of microseconds apart within a step, the step's duration apart between steps). A stream cannot
advance twice in one step, so a second chunk of the same request opens the next cluster even when the
steps were too short to leave a time gap.

Only exact stamps cluster: a user-space stamp is when the read returned, and a kernel stamp shared with
later bytes of the same read (`read_chunks` > 1, not the last chunk of its read) is only an upper bound
(see itl.py). The rest are placed afterwards in the last step at or before their stamp.

Inferred step k runs from cluster k−1's time to cluster k's time (its *spacing*: the logged step's
duration plus the hand-off to the next one; the client cannot see the split). Its columns follow the
step log's (analysis/stalls.py attributes either the same way):
  step, phase, start_ns, end_ns, decode_tokens (streams that advanced), first_token_request_ids,
  prefill_request_ids (server ids, client ids where the server sent none), prefill_tokens (estimated),
  num_preemptions (0: preemption is judged per stall, see client_attribution.py), exact_chunks.
Phases: decode (spacing within slow_factor × the decode cadence, no prefill), slow (longer, no prefill:
unexplained), prefill (a request prefilled in it and no other stream advanced), mixed (both).

Prefill of a request R (FCFS, the order vLLM's and the bundled engine's schedulers prefill in): it ends
with the step whose cluster carries R's first token; it begins with the first step that started after R
was sent, but no earlier than the step that finished the prefill of the request sent before R (chunked
prefill runs one prompt after another; R's head may share that step with its predecessor's tail). A step's
start is known only as the arrival of the previous step's tokens, which trails the engine's own start by the
tokens' trip: a request sent within that trip after a step began is taken to have joined it (an error of one
step at the head of its span, seen in 1 of 20 benchmark runs, docs/perf/attribution.md). One exception: when
the step R was sent in lasts on for `slow_factor` cadences or more after the send and no earlier prefill
ended in it, R's prefill began in it (an engine idle between steps admits a request on arrival; a busy
one would have ended that step within a cadence).
Prefill tokens (`usage.prompt_tokens` − cached, else the planned length) are spread over R's steps by
their excess over the decode cadence (evenly when none exceeds it): an estimate, marked as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from itlbench.analysis.stats import ns_to_s

STR_LIST = pl.List(pl.Utf8)


@dataclass(frozen=True)
class InferParams:
    """slow_factor: a step this many times the decode cadence or longer is slow; min/max_split_ns bound
    the gap between two stamps that separates steps (chosen from the stamps' own gaps, see split_ns)."""

    slow_factor: float = 3.0
    min_split_ns: int = 50_000
    max_split_ns: int = 2_000_000


@dataclass(frozen=True)
class InferredSteps:
    steps: pl.DataFrame        # one row per inferred step (columns in the module docstring)
    chunks: pl.DataFrame       # request_id, index, t_ns, exact, step: every chunk and the step it arrived in
    prefills: pl.DataFrame     # request_id, server_request_id, first_step, last_step, start_ns, end_ns, tokens
    split_ns: int              # stamp gap that separated steps
    cadence_s: float | None    # median spacing of the decode steps

    def summary(self) -> dict[str, object]:
        """What the reconstruction saw, for summary-client.json (every figure here is inferred)."""
        s = self.steps
        phases = {r["phase"]: int(r["len"]) for r in s.group_by("phase").len().to_dicts()} if s.height else {}
        span = ns_to_s(pl.col("end_ns") - pl.col("start_ns"))
        pre = s.filter(pl.col("phase").is_in(["prefill", "mixed"])).select(span.sum()).item() if s.height else 0.0
        dec = s.filter(pl.col("phase") == "decode").select(span.sum()).item() if s.height else 0.0
        return {
            "steps": s.height, "by_phase": phases, "split_us": self.split_ns / 1e3,
            "decode_cadence_s": self.cadence_s,
            "prefills": self.prefills.height,
            "chunks_exact": int(self.chunks["exact"].sum()) if self.chunks.height else 0,
            "chunks": self.chunks.height,
            "prefill_s": float(pre or 0.0), "decode_s": float(dec or 0.0),
        }


def exact_stamp() -> pl.Expr:
    """A chunk's stamp is exact when it is kernel-stamped and no later chunk of its read shares it."""
    last_of_read = (pl.col("t_ns") != pl.col("t_ns").shift(-1).over("request_id")).fill_null(True)
    return ((pl.col("stamp") == "kernel") & (last_of_read | (pl.col("read_chunks").fill_null(1) <= 1))).fill_null(False)


def split_ns(t_ns: np.ndarray, params: InferParams) -> int:
    """The gap between consecutive distinct stamps that best separates within-step gaps from between-step
    ones: Otsu's threshold on log gaps (the two populations sit decades apart), clamped to the bounds."""
    d = np.diff(np.unique(t_ns))
    d = d[d > 0]
    if d.size < 4:
        return params.max_split_ns
    x = np.log10(d.astype(np.float64))
    hist, edges = np.histogram(x, bins=64)
    w = hist.cumsum()
    mu = (hist * (edges[:-1] + edges[1:]) / 2).cumsum()
    total_w, total_mu = w[-1], mu[-1]
    w1 = total_w - w
    with np.errstate(divide="ignore", invalid="ignore"):
        between = (total_mu * w - mu * total_w) ** 2 / (w * w1)
    between = np.nan_to_num(between[:-1], nan=-1.0, posinf=-1.0)
    cut = 10 ** edges[int(np.argmax(between)) + 1]
    return int(min(max(cut, params.min_split_ns), params.max_split_ns))


def _cluster(exact: pl.DataFrame, split: int) -> pl.DataFrame:
    """Cluster ids for exact chunks sorted by time: a gap over `split` opens a cluster, and so does a
    request's second chunk inside one (the occurrence count within a time cluster, kept monotone)."""
    coarse = exact.with_columns((pl.col("t_ns").diff().fill_null(split + 1) > split).cum_sum().alias("_c"))
    occ = coarse.with_columns(pl.col("t_ns").cum_count().over("_c", "request_id").alias("_o"))
    occ = occ.with_columns(pl.col("_o").cum_max().over("_c").alias("_o"))
    return occ.with_columns(pl.struct("_c", "_o").rank("dense").cast(pl.Int64).sub(1).alias("step")).drop("_c", "_o")


def _prefill_spans(requests: pl.DataFrame, first: pl.DataFrame, steps: pl.DataFrame,
                   slow_ns: float) -> pl.DataFrame:
    """Per request with a first token: its prefill's first and last inferred step (module docstring)."""
    starts, ends = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    reqs = (requests.select("request_id", "server_request_id", "sent_ns", *_token_cols(requests))
            .join(first, on="request_id", how="inner").drop_nulls("sent_ns").sort("sent_ns", "request_id"))
    if reqs.is_empty():
        return pl.DataFrame(schema={"request_id": pl.Utf8, "server_request_id": pl.Utf8, "first_step": pl.Int64,
                                    "last_step": pl.Int64, "tokens": pl.Int64})
    last = reqs["last_step"].to_numpy()
    ids = steps["step"].to_numpy()
    sent = reqs["sent_ns"].to_numpy()
    pos = np.searchsorted(starts, sent, side="left")  # the first step that started after the send
    prev_done = np.concatenate([[-1], np.maximum.accumulate(last)[:-1]])
    after_sent = ids[np.minimum(pos, ids.size - 1)]
    joined = _joined_on_arrival(pos, sent, ends, ids, prev_done, slow_ns)
    after_sent = np.where(joined, ids[np.maximum(pos - 1, 0)], after_sent)
    first_step = np.minimum(np.maximum(after_sent, np.minimum(prev_done, last)), last)
    return reqs.with_columns(pl.Series("first_step", first_step, dtype=pl.Int64)).select(
        "request_id", "server_request_id", "first_step", "last_step", "tokens")


def _joined_on_arrival(pos: np.ndarray, sent: np.ndarray, ends: np.ndarray, ids: np.ndarray,
                       prev_done: np.ndarray, slow_ns: float) -> np.ndarray:
    """Per request: True where the step it was sent in (the one before `pos`) lasted on for `slow_ns` or
    more after the send, and no earlier request's prefill ended in it. A step that began before the send
    ends within about one cadence unless something ran in it: an engine idle between its steps (or one
    that admits a request mid-step) started this request's prefill on arrival, inside that step."""
    k = np.clip(pos - 1, 0, max(ids.size - 1, 0))
    return (pos >= 1) & (ends[k] - sent >= max(slow_ns, 1.0)) & (ids[k] > prev_done)


def _token_cols(requests: pl.DataFrame) -> list[pl.Expr]:
    """Uncached prompt tokens: the server's usage where reported, else the planned prompt length."""
    reported = pl.col("prompt_tokens_reported") if "prompt_tokens_reported" in requests.columns else pl.lit(None)
    cached = pl.col("cached_tokens_reported") if "cached_tokens_reported" in requests.columns else pl.lit(None)
    planned = pl.col("prompt_tokens") if "prompt_tokens" in requests.columns else pl.lit(None)
    total = pl.coalesce(reported.cast(pl.Int64), planned.cast(pl.Int64))
    return [(total - cached.cast(pl.Int64).fill_null(0)).clip(lower_bound=0).alias("tokens")]


def infer_steps(chunks: pl.DataFrame, requests: pl.DataFrame, params: InferParams | None = None) -> InferredSteps:
    """Reconstruct the engine's steps and the requests' prefills from chunks and requests alone."""
    params = params or InferParams()
    tagged = (chunks.select("request_id", "index", "t_ns",
                            *[pl.col(c) if c in chunks.columns else pl.lit(None, dtype=t).alias(c)
                              for c, t in (("stamp", pl.Utf8), ("read_chunks", pl.Int64))])
              .sort("request_id", "index", "t_ns").with_columns(exact_stamp().alias("exact")))
    exact = tagged.filter(pl.col("exact")).sort("t_ns", "request_id")
    if exact.is_empty():  # user-space stamps only: read returns stand in (coarser, stated by the caller)
        exact = tagged.sort("t_ns", "request_id").with_columns(pl.lit(True).alias("exact"))
    split = split_ns(exact["t_ns"].to_numpy(), params)
    clustered = _cluster(exact, split)
    ends = (clustered.group_by("step").agg(pl.col("t_ns").min().alias("end_ns"),
                                           pl.col("request_id").n_unique().cast(pl.Int64).alias("decode_tokens"),
                                           pl.len().cast(pl.Int64).alias("exact_chunks"))
            .sort("step").with_columns(pl.col("end_ns").shift(1).alias("start_ns")).drop_nulls("start_ns"))
    placed = (tagged.sort("t_ns").join_asof(ends.select("end_ns", "step").sort("end_ns"), left_on="t_ns",
                                            right_on="end_ns", strategy="backward").drop("end_ns"))
    first = (placed.filter(pl.col("index") == 0).drop_nulls("step")
             .group_by("request_id").agg(pl.col("step").min().alias("last_step")))
    cadence_ns = float((ends["end_ns"] - ends["start_ns"]).median() or 0) if ends.height else 0.0  # type: ignore[arg-type]
    spans = _prefill_spans(requests, first, ends, params.slow_factor * cadence_ns)
    steps = _with_prefills(ends, spans, first, params, cadence_ns)
    cadence = _cadence(steps)
    return InferredSteps(steps, placed, spans.join(steps.select("step", "start_ns"), left_on="first_step",
                                                   right_on="step", how="left")
                         .join(steps.select("step", "end_ns"), left_on="last_step", right_on="step", how="left"),
                         split, cadence)


def _cadence(steps: pl.DataFrame) -> float | None:
    dec = steps.filter(pl.col("phase") == "decode")
    return float(ns_to_s(dec["end_ns"] - dec["start_ns"]).median()) if dec.height else None  # type: ignore[arg-type]


def _with_prefills(ends: pl.DataFrame, spans: pl.DataFrame, first: pl.DataFrame, params: InferParams,
                   cadence_ns: float) -> pl.DataFrame:
    """Each step's prefilling requests, estimated prefill tokens, first tokens and phase."""
    dur = pl.col("end_ns") - pl.col("start_ns")
    base = ends.with_columns(dur.alias("_dur"))
    sid = pl.coalesce("server_request_id", "request_id")
    member = (spans.with_columns(pl.int_ranges("first_step", pl.col("last_step") + 1).alias("step"), sid.alias("sid"))
              .explode("step").join(base.select("step", "_dur"), on="step", how="inner")
              .with_columns((pl.col("_dur") - cadence_ns).clip(lower_bound=0).alias("_x")))
    member = member.with_columns(pl.when(pl.col("_x").sum().over("request_id") > 0)
                                 .then(pl.col("_x") / pl.col("_x").sum().over("request_id"))
                                 .otherwise(1.0 / pl.len().over("request_id")).alias("_share"))
    per_step = member.group_by("step").agg(
        pl.col("sid").unique().sort().alias("prefill_request_ids"),
        (pl.col("tokens").fill_null(0) * pl.col("_share")).sum().round(0).cast(pl.Int64).alias("prefill_tokens"))
    firsts = (first.join(spans.select("request_id", "server_request_id"), on="request_id", how="left")
              .group_by("last_step").agg(pl.coalesce("server_request_id", "request_id").sort()
                                         .alias("first_token_request_ids")).rename({"last_step": "step"}))
    out = (base.join(per_step, on="step", how="left").join(firsts, on="step", how="left")
           .with_columns(pl.col("prefill_request_ids").fill_null(pl.lit([], dtype=STR_LIST)),
                         pl.col("first_token_request_ids").fill_null(pl.lit([], dtype=STR_LIST)),
                         pl.col("prefill_tokens").fill_null(0), pl.lit(0).alias("num_preemptions")))
    advanced_other = pl.col("decode_tokens") > pl.col("first_token_request_ids").list.len()
    slow = pl.col("_dur") >= params.slow_factor * cadence_ns
    phase = (pl.when(pl.col("prefill_request_ids").list.len() > 0)
             .then(pl.when(advanced_other).then(pl.lit("mixed")).otherwise(pl.lit("prefill")))
             .when(slow).then(pl.lit("slow")).otherwise(pl.lit("decode")))
    return out.with_columns(phase.alias("phase")).drop("_dur").select(
        "step", "phase", "start_ns", "end_ns", "decode_tokens", "prefill_tokens", "prefill_request_ids",
        "first_token_request_ids", "num_preemptions", "exact_chunks")
