"""How well the client-only attribution agrees with the step log, on a run that has one (the bundled engine).

Why: the method (inferred_steps.py, client_attribution.py) is only worth what it gets right where the truth
is known. Both analyses judge the same gaps (same stall rule, same window), so their stalls pair one to one.
  prefill agreement  of the stalled seconds the step log attributes to a prefill (cause prefill), the share
                     whose *dominant* prefilling request (the one whose prefill steps overlap the gap longest)
                     the client-only analysis names the same (`same_s`; where either side has a tie, the
                     share of the client's dominant requests that the step log's include), or names among
                     its prefills (`named_s`)
  false prefill      stalled seconds the client calls prefill and the step log does not
  step error         per inferred step matched to consecutive logged steps: inferred spacing − logged spacing
                     (end to end, what a client can see) and − logged duration (start to end)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl

from itlbench.analysis import itl
from itlbench.analysis.client_attribution import requests_for_attribution
from itlbench.analysis.client_summary import windowed_client_stalls
from itlbench.analysis.inferred_steps import InferredSteps
from itlbench.analysis.stalls import StallParams, analyze_stalls
from itlbench.analysis.window import RunWindow, select_window

KEY = ["request_id", "t_prev_ns", "t_ns"]


def dominant_prefill(stalls: pl.DataFrame, steps: pl.DataFrame, requests: pl.DataFrame) -> pl.DataFrame:
    """Per stall (KEY): the client request ids whose prefill steps overlap the gap longest (`dominant`, a list:
those within 1 % of the longest tie)."""
    ids = requests_for_attribution(requests).select("server_request_id", "request_id").unique("server_request_id")
    prefill = (steps.filter(pl.col("prefill_tokens") > 0).select("start_ns", "end_ns", "prefill_request_ids")
               .explode("prefill_request_ids").drop_nulls("prefill_request_ids")
               .join(ids, left_on="prefill_request_ids", right_on="server_request_id", how="left")
               .select("start_ns", "end_ns", pl.coalesce("request_id", "prefill_request_ids").alias("rid")))
    gaps = stalls.select(*KEY)
    hits = gaps.join_where(prefill, pl.col("start_ns") < pl.col("t_ns"), pl.col("end_ns") > pl.col("t_prev_ns"))
    over = (hits.with_columns((pl.min_horizontal("end_ns", "t_ns") - pl.max_horizontal("start_ns", "t_prev_ns"))
                              .alias("_o"))
            .group_by(*KEY, "rid").agg(pl.col("_o").sum())
            .filter(pl.col("_o") >= 0.99 * pl.col("_o").max().over(KEY))
            .group_by(KEY).agg(pl.col("rid").sort().alias("dominant")))
    return gaps.join(over, on=KEY, how="left")


def _truth(tables: Mapping[str, pl.DataFrame], window: RunWindow, params: StallParams) -> pl.DataFrame:
    t = select_window(tables, window)
    gaps = itl.gap_table(t["all_chunks"], t["all_requests"]).filter(
        (pl.col("t_ns") >= window.measure_start_ns) & (pl.col("t_ns") < window.end_ns))
    report = analyze_stalls(itl.steady(gaps), t["steps"], t["all_requests"], params, window.measure_start_ns,
                            t["client_pauses"], t["scrapes"])
    dom = dominant_prefill(report.stalls, t["steps"], t["all_requests"])
    return report.stalls.select(*KEY, "gap_s", "cause").join(dom, on=KEY, how="left")


def compare(tables: Mapping[str, pl.DataFrame], window: RunWindow, params: StallParams | None = None) -> dict[str, object]:
    """Agreement of the client-only attribution with the step log's, and the inferred steps' timing error."""
    params = params or StallParams()
    truth = _truth(tables, window, params)
    client = windowed_client_stalls(tables, window, params)
    cstalls = client.report.stalls
    cdom = dominant_prefill(cstalls, client.inferred.steps, tables["requests"])
    mine = (cstalls.select(*KEY, pl.col("cause").alias("client_cause"), "prefill_request_ids", "injected_request_ids",
                           "unknown_reason").join(cdom.rename({"dominant": "client_dominant"}), on=KEY, how="left"))
    both = truth.join(mine, on=KEY, how="left")
    pre = both.filter(pl.col("cause") == "prefill")
    # the share of the client's dominant requests (a tie: several) that the step log's dominant ones include:
    # a tie both sides see (two prompts prefilled in one step) earns it whole, a name too many halves it
    common = pl.col("client_dominant").list.set_intersection(pl.col("dominant")).list.len()
    credit = (common / pl.col("client_dominant").list.len()).fill_null(0.0).fill_nan(0.0)
    same = pre.with_columns((pl.col("gap_s") * credit).alias("gap_s")).filter(pl.col("gap_s") > 0)
    named = pre.filter((pl.col("prefill_request_ids").list.set_intersection(pl.col("dominant")).list.len() > 0)
                       .fill_null(False))
    false_pre = both.filter((pl.col("client_cause") == "prefill") & (pl.col("cause") != "prefill"))
    total = float(pre["gap_s"].sum()) if pre.height else 0.0
    causes = (both.group_by("cause", "client_cause").agg(pl.len().alias("n"), pl.col("gap_s").sum().alias("s"))
              .sort("s", descending=True).to_dicts())
    return {
        "stalls": truth.height,
        "stalled_s": float(truth["gap_s"].sum()) if truth.height else 0.0,
        "prefill_stalled_s": total,
        "same_s": float(same["gap_s"].sum()) if same.height else 0.0,
        "named_s": float(named["gap_s"].sum()) if named.height else 0.0,
        "same_frac": float(same["gap_s"].sum()) / total if total > 0 else None,
        "named_frac": float(named["gap_s"].sum()) / total if total > 0 else None,
        "false_prefill_s": float(false_pre["gap_s"].sum()) if false_pre.height else 0.0,
        "client_injected_named": int(cstalls.filter(pl.col("injected_request_ids").list.len() > 0).height)
        if cstalls.height else 0,
        "causes": causes,
        "steps": step_error(client.inferred, select_window(tables, window)["steps"]),
        "inferred": client.inferred.summary(),
    }


def step_error(inferred: InferredSteps, logged: pl.DataFrame) -> dict[str, object]:
    """Inferred steps matched to the logged step whose end last precedes their end stamp; those whose start
    (the previous cluster) matches the logged step before it are compared (milliseconds)."""
    if inferred.steps.is_empty() or logged.is_empty():
        return {"matched": 0}
    log = logged.sort("end_ns").with_row_index("_k").select(
        "_k", "start_ns", "end_ns", pl.col("end_ns").diff().alias("spacing"), pl.col("prefill_tokens"))
    inf = inferred.steps.sort("end_ns").select(pl.col("start_ns").alias("i_start"), pl.col("end_ns").alias("i_end"))
    end_k = inf.join_asof(log.select(pl.col("end_ns").alias("e"), "_k"), left_on="i_end", right_on="e",
                          strategy="backward").rename({"_k": "k"})
    both = end_k.join_asof(log.select(pl.col("end_ns").alias("e2"), pl.col("_k").alias("k0")), left_on="i_start",
                           right_on="e2", strategy="backward")
    paired = both.filter(pl.col("k0") == pl.col("k") - 1).join(log, left_on="k", right_on="_k", how="inner")
    if paired.is_empty():
        return {"matched": 0}
    spacing = ((pl.col("i_end") - pl.col("i_start")) - pl.col("spacing")) / 1e6
    duration = ((pl.col("i_end") - pl.col("i_start")) - (pl.col("end_ns") - pl.col("start_ns"))) / 1e6
    err = paired.select(spacing.alias("spacing"), duration.alias("duration"),
                        (pl.col("prefill_tokens") > 0).alias("prefill"), (pl.col("spacing") / 1e6).alias("ms"))
    out: dict[str, object] = {"matched": err.height, "logged": logged.height, "inferred": inferred.steps.height,
                              "coverage": paired["k"].n_unique() / logged.height}
    for name, rows in (("all", err), ("prefill", err.filter(pl.col("prefill")))):
        if rows.is_empty():
            continue
        a = np.abs(rows["spacing"].to_numpy())
        rel = a / np.maximum(rows["ms"].to_numpy(), 1e-9)
        out[name] = {"n": rows.height, "spacing_err_p50_ms": float(np.median(rows["spacing"].to_numpy())),
                     "abs_p50_ms": float(np.percentile(a, 50)), "abs_p90_ms": float(np.percentile(a, 90)),
                     "abs_p99_ms": float(np.percentile(a, 99)), "abs_max_ms": float(a.max()),
                     "rel_p50": float(np.percentile(rel, 50)), "rel_p90": float(np.percentile(rel, 90)),
                     "within_1ms": float((a <= 1.0).mean()),
                     "duration_err_p50_ms": float(np.median(rows["duration"].to_numpy()))}
    return out
