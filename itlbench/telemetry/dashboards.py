"""Grafana dashboards, generated: `python -m itlbench.telemetry.dashboards` writes dashboards/*.json
(`--check` fails when the committed files differ from what this module generates).

Two dashboards. *Load test*: the client's view (TTFT by prompt bucket, ITL percentiles, worst gap
and heatmap, stalls by cause) beside the bundled engine's (prefill:decode split, steps by phase,
token-budget use) and the engine state (queue, running, KV, throughput), with injections and runs as
annotations. *Engine*: the serving metrics that vLLM, SGLang and the bundled engine share, one
dashboard for all three through the `prefix` variable (`vllm:`, `sglang:`, `itlbench_`); where
their names differ a panel matches every spelling with one `__name__` regex, never with `or`, so a
panel whose metric nobody exports stays empty (the tests query every panel against a real scrape).
The datasource is the variable `DS_PROMETHEUS`; rates use `$__rate_interval`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
RI = "$__rate_interval"
SCHEMA_VERSION = 39
OUT_DIR = Path("dashboards")  # relative to where it runs (the repository root), never inside the installed package
PREFIXES = ("itlbench_", "vllm:", "sglang:")
ENGINE = 'model_name=~"$model_name"'
TOKS = "suffix: tok/s"


@dataclass(frozen=True)
class Q:
    """One PromQL target."""

    expr: str
    legend: str = ""
    fmt: str = "time_series"  # time_series | heatmap | table
    instant: bool = False


def quantile(q: float, bucket_selector: str, by: str = "") -> str:
    groups = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({groups}) (rate({bucket_selector}[{RI}])))"


def name_re(*names: str) -> str:
    """A selector for a metric spelled differently by different engines, under the prefix variable."""
    alts = "|".join(names)
    return f'{{__name__=~"${{prefix}}({alts})", {ENGINE}}}' if len(names) > 1 else \
        f'{{__name__="${{prefix}}{names[0]}", {ENGINE}}}'


def pm(name: str) -> str:
    """A metric every engine names alike, under the prefix variable."""
    return f"${{prefix}}{name}{{{ENGINE}}}"


@dataclass
class Board:
    """Panels laid out left to right on Grafana's 24-column grid, rows full width."""

    uid: str
    title: str
    description: str
    panels: list[dict[str, Any]] = field(default_factory=list)
    variables: list[dict[str, Any]] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _h: int = 0

    def _place(self, w: int, h: int) -> dict[str, int]:
        if self._x + w > 24:
            self._x, self._y, self._h = 0, self._y + self._h, 0
        pos = {"h": h, "w": w, "x": self._x, "y": self._y}
        self._x += w
        self._h = max(self._h, h)
        return pos

    def row(self, title: str) -> None:
        if self._x:
            self._x, self._y, self._h = 0, self._y + self._h, 0
        self.panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                            "id": len(self.panels) + 1, "gridPos": {"h": 1, "w": 24, "x": 0, "y": self._y}})
        self._y += 1

    def add(self, kind: str, title: str, description: str, targets: list[Q], unit: str, *, w: int = 12,
            h: int = 8, stack: bool = False, bars: bool = False, options: dict[str, Any] | None = None) -> None:
        panel: dict[str, Any] = {
            "id": len(self.panels) + 1, "type": kind, "title": title, "description": description,
            "datasource": DS, "gridPos": self._place(w, h),
            "targets": [_target(q, chr(ord("A") + i)) for i, q in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": options or {}}
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {
                "drawStyle": "bars" if bars else "line", "lineWidth": 1, "fillOpacity": 60 if (stack or bars) else 10,
                "showPoints": "never", "spanNulls": False, "stacking": {"mode": "normal" if stack else "none"}}
            panel["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]},
                                "tooltip": {"mode": "multi", "sort": "desc"}, **(options or {})}
        self.panels.append(panel)

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "title": self.title, "description": self.description, "tags": ["itlbench"],
                "editable": True, "graphTooltip": 1, "refresh": "5s", "schemaVersion": SCHEMA_VERSION,
                "time": {"from": "now-15m", "to": "now"}, "timepicker": {}, "timezone": "browser", "version": 1,
                "templating": {"list": self.variables},
                "annotations": {"list": [_builtin_annotation(), *self.annotations]}, "panels": self.panels,
                "links": []}


def _target(q: Q, ref: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": q.expr, "legendFormat": q.legend, "format": q.fmt,
            "instant": q.instant, "range": not q.instant, "editorMode": "code"}


def _builtin_annotation() -> dict[str, Any]:
    return {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}


def _annotation(name: str, expr: str, color: str, title: str, text: str) -> dict[str, Any]:
    return {"name": name, "datasource": DS, "enable": True, "hide": False, "iconColor": color, "expr": expr,
            "step": "5s", "titleFormat": title, "textFormat": text, "tagKeys": "", "useValueForTime": False,
            "target": {"refId": "Anno", "expr": expr, "legendFormat": title, "range": True}}


def _datasource_variable() -> dict[str, Any]:
    return {"name": "DS_PROMETHEUS", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": [], "includeAll": False, "multi": False}


def _prefix_variable() -> dict[str, Any]:
    options = [{"text": p, "value": p, "selected": p == PREFIXES[0]} for p in PREFIXES]
    return {"name": "prefix", "label": "Engine metric prefix", "type": "custom", "query": ",".join(PREFIXES),
            "current": {"text": PREFIXES[0], "value": PREFIXES[0]}, "options": options, "hide": 0,
            "includeAll": False, "multi": False,
            "description": "itlbench_ (bundled engine), vllm: (vLLM) or sglang: (SGLang)"}


def _query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": f"var-{name}"}, "definition": query, "refresh": 2,
            "includeAll": True, "allValue": ".*", "multi": False, "current": {"text": "All", "value": "$__all"},
            "hide": 0, "sort": 1, "regex": "", "options": []}


# ---- the load-test dashboard ------------------------------------------------------------------------
C = "itlbench_client_"
WL = 'workload=~"$workload"'


def load_test() -> Board:
    b = Board("itlbench-load", "itlbench: load test",
              "What a long prompt does to streaming latency while the load runs: the client's TTFT, ITL and "
              "stalls beside the engine steps behind them. Injections and runs are annotations.")
    b.variables = [_datasource_variable(), _prefix_variable(),
                   _query_variable("model_name", "Model", 'label_values({__name__=~"${prefix}.+"}, model_name)'),
                   _query_variable("workload", "Workload", f"label_values({C}time_to_first_token_seconds_count, workload)")]
    b.annotations = [
        _annotation("Injections", f'sum(increase({C}requests_sent_total{{injected="true"}}[{RI}])) > 0', "red",
                    "long prompt injected", "a long prompt was sent"),
        _annotation("Runs", f"{C}run_info", "green", "run {{run_id}}",
                    "workload {{workload}}, chunk budget {{chunk_budget}}, policy {{policy}}, engine {{engine}}")]
    _client_latency(b)
    _stalls_and_steps(b)
    _engine_state(b)
    _client_health(b)
    return b


def _client_latency(b: Board) -> None:
    b.row("Client: time to first token and inter-token latency")
    ttft = f"{C}time_to_first_token_seconds_bucket{{{WL}}}"
    b.add("timeseries", "TTFT by prompt bucket (p50, p99)",
          "Scheduled send to the first token-carrying chunk, by prompt-length bucket (le128 … gt32k; k = 1024).",
          [Q(quantile(0.5, ttft, "prompt_bucket"), "{{prompt_bucket}} p50"),
           Q(quantile(0.99, ttft, "prompt_bucket"), "{{prompt_bucket}} p99")], "s")
    itl = f"{C}inter_token_latency_seconds_bucket{{{WL}}}"
    b.add("timeseries", "ITL per gap: p50, p90, p99 and the worst gap",
          "Every gap between consecutive content chunks of a stream, pooled. max: the longest gap in the window "
          "(a stall shows here first; percentiles hide a rare long gap).",
          [Q(quantile(0.5, itl), "p50"), Q(quantile(0.9, itl), "p90"), Q(quantile(0.99, itl), "p99"),
           Q(f"max_over_time({C}inter_token_latency_max_seconds[{RI}])", "max")], "s",
          options={"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]}})
    b.add("heatmap", "ITL heatmap", "Gaps per latency bucket per interval: a stall is a band far above the "
          "steady rhythm.",
          [Q(f"sum by (le) (increase({itl}[{RI}]))", "{{le}}", fmt="heatmap")], "s",
          options={"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
                   "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5},
                   "rowsFrame": {"layout": "auto"}, "tooltip": {"mode": "single", "yHistogram": True},
                   "legend": {"show": True}})
    e2e = f"{C}e2e_request_latency_seconds_bucket{{{WL}}}"
    b.add("timeseries", "End-to-end latency by prompt bucket (p50, p99)", "Scheduled send to the end of the stream "
          "of successful requests.",
          [Q(quantile(0.5, e2e, "prompt_bucket"), "{{prompt_bucket}} p50"),
           Q(quantile(0.99, e2e, "prompt_bucket"), "{{prompt_bucket}} p99")], "s")


def _stalls_and_steps(b: Board) -> None:
    b.row("Stalls and the engine steps behind them (bundled engine)")
    b.add("timeseries", "Stalled gaps by cause (count so far in the run)",
          "Gaps ≥ max(stall factor × its request's median gap so far, stall floor), by cause: prefill, client, "
          "preemption, engine, outside_engine, unknown (no step log). Whole counts since the run began (each "
          "run starts from 0): a step up is a stall, once its cause is decided. (An increase() per interval "
          "would extrapolate to fractions and show one stall in several overlapping windows.)",
          [Q(f"sum by (cause) ({C}stalls_total)", "{{cause}}")], "short", stack=True)
    b.add("timeseries", "Stalled seconds by cause (streams stalled at once)", "Seconds of stalled gaps per "
          "second of wall time, summed over streams: the mean number of streams inside a stalled gap (32 "
          "streams each stalled for the whole interval read 32). Counted when a stall's cause is decided.",
          [Q(f"sum by (cause) (rate({C}stalled_seconds_total[{RI}]))", "{{cause}}")], "short", stack=True)
    step_sum = 'itlbench_engine_step_duration_seconds_sum{phase!="idle", ' + ENGINE + "}"
    b.add("timeseries", "Prefill:decode split (share of engine wall time)",
          "Engine step seconds per second of wall time, by step phase: steps run one after another, so the "
          "stack is the engine's busy share (100 % = never idle). prefill and decode steps are pure; mixed "
          "steps carry both (the post-run analysis apportions them with a cost model).",
          [Q(f"sum by (phase) (rate({step_sum}[{RI}]))", "{{phase}}")], "percentunit", stack=True)
    b.add("timeseries", "Engine steps per second by phase", "The phase of every step over time: prefill, decode, "
          "mixed (emergent from the token budget, never declared).",
          [Q(f'sum by (phase) (rate(itlbench_engine_steps_total{{phase!="idle", {ENGINE}}}[{RI}]))', "{{phase}}")],
          "ops", stack=True)
    dur = f'itlbench_engine_step_duration_seconds_bucket{{phase!="idle", {ENGINE}}}'
    b.add("timeseries", "Step duration by phase (p50, p99)", "How long a step of each phase takes: every stream "
          "in the batch waits for the whole step.",
          [Q(quantile(0.5, dur, "phase"), "{{phase}} p50"), Q(quantile(0.99, dur, "phase"), "{{phase}} p99")], "s")
    ratio = f"itlbench_engine_step_budget_used_ratio_bucket{{{ENGINE}}}"

    def used(part: str) -> str:
        return f"itlbench_engine_step_budget_used_ratio_{part}{{{ENGINE}}}"

    b.add("timeseries", "Token-budget use per step (p50, fullest step, mean)",
          "Scheduled tokens ÷ chunk budget, chunked steps only. p50: the typical step; decode steps use a sliver "
          "(one token per running stream). max: the fullest step of the interval, read as the upper edge of its "
          "bucket (histogram_quantile(1, …)); the steps that carry a long prompt's chunks fill the budget, so it "
          "jumps towards 100 % at each injection, however many decode steps surround them.",
          [Q(quantile(0.5, ratio), "p50"), Q(quantile(1, ratio), "max"),
           Q(f"sum(rate({used('sum')}[{RI}])) / sum(rate({used('count')}[{RI}]))", "mean")],
          "percentunit")
    b.add("timeseries", "Tokens scheduled per second: prefill vs decode", "Prefill and decode tokens the engine "
          "ran per second.",
          [Q(f"sum(rate(itlbench_engine_step_prefill_tokens_sum{{{ENGINE}}}[{RI}]))", "prefill"),
           Q(f"sum(rate(itlbench_engine_step_decode_tokens_sum{{{ENGINE}}}[{RI}]))", "decode")], TOKS, stack=True)
    # over the whole range, not at its end: an instant query lists only what is up now, so a finished run
    # (its client gone) and an engine's earlier chunk budget vanished from the table
    b.add("table", "Engine and run", "Every engine configuration and client run of the time range, one row "
          "each: a chunk-budget change shows as a new row, a finished run stays listed.",
          [Q(f"max by (model_name, chunk_budget, policy, mixed, max_num_seqs, kv_blocks, device, dtype) "
             f"(last_over_time(itlbench_engine_config_info{{{ENGINE}}}[$__range]))", fmt="table", instant=True),
           Q(f"max by (run_id, workload, chunk_budget, policy, engine, model) (last_over_time({C}run_info[$__range]))",
             fmt="table", instant=True)], "short",
          options={"showHeader": True, "cellHeight": "sm"})


def _engine_state(b: Board) -> None:
    b.row("Engine state ($prefix)")
    b.add("timeseries", "Queue depth (waiting requests)", "Requests admitted but not yet scheduled.",
          [Q(f"sum({name_re('num_requests_waiting', 'num_queue_reqs')})", "waiting")], "short", w=8)
    b.add("timeseries", "Running requests", "Requests in the running batch.",
          [Q(f"sum({name_re('num_requests_running', 'num_running_reqs')})", "running")], "short", w=8)
    b.add("timeseries", "KV-cache usage", "Fraction of KV-cache blocks (tokens, on SGLang) in use.",
          [Q(f"max({name_re('kv_cache_usage_perc', 'gpu_cache_usage_perc', 'token_usage')})", "KV usage")],
          "percentunit", w=8)
    b.add("timeseries", "Token throughput", "Output tokens per second seen by the client and generated by the "
          "server, and prompt tokens the server took in.",
          [Q(f"sum(rate({C}output_tokens_total[{RI}]))", "client output"),
           Q(f"sum(rate({pm('generation_tokens_total')}[{RI}]))", "server generated"),
           Q(f"sum(rate({pm('prompt_tokens_total')}[{RI}]))", "server prompt")], TOKS)
    b.add("timeseries", "Requests per second by outcome", "Requests the client finished, by outcome.",
          [Q(f"sum by (outcome) (rate({C}requests_total[{RI}]))", "{{outcome}}")], "reqps", stack=True)


def _client_health(b: Board) -> None:
    b.row("Client health (a run is valid only while the client keeps up)")
    b.add("timeseries", "Client in-flight requests", "Sent and not yet ended, steady and injected.",
          [Q(f"sum by (injected) ({C}requests_in_flight)", "injected={{injected}}")], "short", w=8)
    send = f"{C}send_lag_seconds_bucket"
    b.add("timeseries", "Client lag", "Event-loop lag (a sleep's late wake-up) and send lag p99 (scheduled → "
          "sent): when these grow the client, not the server, sets the latency.",
          [Q(f"max_over_time({C}loop_lag_seconds[{RI}])", "event-loop lag"), Q(quantile(0.99, send), "send lag p99")],
          "s", w=8)
    b.add("timeseries", "Client CPU", "The client process's CPU (100 % = one core); the run flags itself invalid "
          "above 50 %.", [Q(f"max_over_time({C}cpu_percent[{RI}])", "client CPU")], "percent", w=8)


# ---- the engine dashboard ---------------------------------------------------------------------------
def engine() -> Board:
    b = Board("itlbench-engine", "itlbench: serving engine",
              "vLLM, SGLang or the bundled itlbench engine through one metric-prefix variable: latency as the "
              "server sees it, batch and queue, KV cache, throughput.")
    b.variables = [_datasource_variable(), _prefix_variable(),
                   _query_variable("model_name", "Model", 'label_values({__name__=~"${prefix}.+"}, model_name)')]
    b.row("Latency at the server")
    for title, name, desc in (
            ("Time to first token", "time_to_first_token_seconds", "Arrival at the server to the first token."),
            ("Inter-token latency", "inter_token_latency_seconds", "Gap between a request's token outputs."),
            ("End-to-end request latency", "e2e_request_latency_seconds", "Arrival to finish.")):
        bucket = pm(name + "_bucket")
        b.add("timeseries", f"{title} (p50, p90, p99)", desc,
              [Q(quantile(0.5, bucket), "p50"), Q(quantile(0.9, bucket), "p90"), Q(quantile(0.99, bucket), "p99")],
              "s", w=8)
    phases = [Q(f"sum(rate({pm(f'request_{p}_time_seconds_sum')}[{RI}])) / "
                f"sum(rate({pm(f'request_{p}_time_seconds_count')}[{RI}]))", p)
              for p in ("queue", "prefill", "decode")]
    b.add("timeseries", "Mean queue, prefill and decode time per request",
          "vLLM and the bundled engine: arrival → scheduled, scheduled → first token, first token → finish.",
          phases, "s")
    b.add("timeseries", "Tokens per engine step (p50, p99)", "vLLM and the bundled engine: tokens scheduled per "
          "step, up to the chunk budget.",
          [Q(quantile(0.5, pm("iteration_tokens_total_bucket")), "p50"),
           Q(quantile(0.99, pm("iteration_tokens_total_bucket")), "p99")], "short")
    b.row("Batch, queue and KV cache")
    b.add("timeseries", "Running and waiting requests", "The running batch and the queue behind it.",
          [Q(f"sum({name_re('num_requests_running', 'num_running_reqs')})", "running"),
           Q(f"sum({name_re('num_requests_waiting', 'num_queue_reqs')})", "waiting")], "short", w=8)
    b.add("timeseries", "KV-cache usage", "Fraction of KV-cache blocks (tokens, on SGLang) in use.",
          [Q(f"max({name_re('kv_cache_usage_perc', 'gpu_cache_usage_perc', 'token_usage')})", "KV usage")],
          "percentunit", w=8)
    b.add("timeseries", "Preemptions per second", "vLLM and the bundled engine: requests preempted to free KV "
          "blocks (recomputed later).", [Q(f"sum(rate({pm('num_preemptions_total')}[{RI}]))", "preemptions")],
          "ops", w=8)
    b.row("Throughput")
    b.add("timeseries", "Token throughput", "Prompt tokens taken in and tokens generated per second.",
          [Q(f"sum(rate({pm('prompt_tokens_total')}[{RI}]))", "prompt"),
           Q(f"sum(rate({pm('generation_tokens_total')}[{RI}]))", "generated")], TOKS)
    b.add("timeseries", "Finished requests per second by reason", "vLLM and the bundled engine: stop, length, "
          "abort.", [Q(f"sum by (finished_reason) (rate({pm('request_success_total')}[{RI}]))", "{{finished_reason}}")],
          "reqps", stack=True)
    b.add("timeseries", "Prompt and output length per request (p50, p99)", "vLLM and the bundled engine.",
          [Q(quantile(0.5, pm("request_prompt_tokens_bucket")), "prompt p50"),
           Q(quantile(0.99, pm("request_prompt_tokens_bucket")), "prompt p99"),
           Q(quantile(0.5, pm("request_generation_tokens_bucket")), "output p50"),
           Q(quantile(0.99, pm("request_generation_tokens_bucket")), "output p99")], "short")
    return b


BOARDS = {"itlbench-load.json": load_test, "itlbench-engine.json": engine}


def render(board: Board) -> str:
    return json.dumps(board.to_json(), indent=2, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    return {name: render(make()) for name, make in BOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT_DIR, help="directory to write (default: ./dashboards)")
    p.add_argument("--check", action="store_true", help="fail if the files differ from what would be written")
    a = p.parse_args(argv)
    stale, missing = [], []
    for name, text in generate().items():
        path = a.out / name
        if a.check:
            if not path.is_file():
                missing.append(str(path))
            elif path.read_text() != text:
                stale.append(str(path))
        else:
            a.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(path)
    fix = f"run `python -m itlbench.telemetry.dashboards --out {a.out}` from the repository root"
    if missing:  # not out of date: not there (run from elsewhere, or --out names another directory)
        print(f"missing ({fix}, or give --out the dashboards directory): " + ", ".join(missing), file=sys.stderr)
    if stale:
        print(f"out of date ({fix}): " + ", ".join(stale), file=sys.stderr)
    if a.check and not (stale or missing):  # a check that passes says so: silence read as nothing checked
        print(f"up to date: {', '.join(str(a.out / name) for name in generate())}")
    return 1 if stale or missing else 0


if __name__ == "__main__":
    sys.exit(main())
