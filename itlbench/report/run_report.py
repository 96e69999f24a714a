"""`itlbench report RUN_DIR`: one run as report.html + report.md + figures/, written into the run directory.

Reading order: the verdict (what froze, why, and whether the run can be trusted), the stall picture,
the engine's steps that explain it, then TTFT, ITL, throughput, split and goodput, and last what
it takes to reproduce the run and what every figure means.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.analysis.definitions import DEFINITIONS
from itlbench.analysis.stalls import StallParams
from itlbench.report.data import RunData, load_run, unreadable_line
from itlbench.report.document import (
    Callout,
    Code,
    Definitions,
    Document,
    Section,
    Written,
    write_document,
)
from itlbench.report.engines import serving_warnings
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.figures import run_figures
from itlbench.report.queueing import queueing_sentence
from itlbench.report.reproduce import reproduce_command
from itlbench.report.run_tables import (
    events_table,
    goodput_misses,
    itl_table,
    kv_table,
    loop_lag,
    reasoning_section,
    send_lag,
    totals_table,
    ttft_table,
)
from itlbench.report.slos import slo_text
from itlbench.report.style import BAD_TEXT, fmt_s, fmt_tokens
from itlbench.report.timeline import injected_spans, layout
from itlbench.report.withdrawn import Withdrawn

DEFINITION_NAMES = {"ttft": "TTFT", "itl": "ITL", "reasoning": "Reasoning streams", "stall": "Stall", "split": "Prefill:decode split",
                    "prompt_buckets": "Prompt buckets", "goodput": "Goodput", "validity": "Validity",
                    "window": "Window", "percentiles": "Percentiles"}


def first_sentence(text: str) -> str:
    """The definition's first sentence, without its 'Name:' lead-in."""
    head = text.split(": ", 1)[1] if ": " in text.split(".")[0] else text
    end = head.find(". ")
    return head if end < 0 else head[: end + 1]


def title_of(data: RunData) -> str:
    cfg = data.config
    parts = [str(cfg.get("workload") or "run")]
    if cfg.get("inject"):
        parts.append(f"inject {cfg['inject']}")
    parts.append(data.setting_label() if data.engine_config else data.engine.name)
    return " · ".join(parts)


class _Marks:
    """A headline's marks: each withdrawn figure flagged where it is stated, its reasons said once at the end."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.gone = Withdrawn.of(summary)
        self.named: dict[str, list[str]] = {}  # why → the figures it withdrew, in the order stated

    def flag(self, text: str, figure: str, name: str) -> str:
        """`text` (a sentence or a clause) with '(not valid)' before its full stop when `figure` was withdrawn."""
        why = self.gone.why(figure)
        if why is None:
            return text
        parts = self.gone.parts(figure)
        self.named.setdefault(why, []).append(f"{name} {', '.join(parts)}" if parts else name)
        mark = f"({', '.join(parts) + ' ' if parts else ''}not valid)"
        return f"{text.removesuffix('.')} {mark}." if text.endswith(".") else f"{text} {mark}"

    def why(self) -> list[str]:
        return [f"Not valid: {', '.join(dict.fromkeys(names))}, as the verdict above says ({why})."
                for why, names in self.named.items()]


def headline(data: RunData) -> str:
    """The run in two plain sentences: what the injected prompt did, then the steady streams' ITL; a figure
    the run's validity verdict withdrew is marked where it is stated, and why is said after."""
    s, out = data.summary, []
    marks = _Marks(s)
    stalls = s.get("stalls") or {}
    spans = injected_spans(data)
    if spans:
        span = spans[0]
        lo, hi = data.t0_ns + int(span.start_s * 1e9), data.t0_ns + int(span.end_s * 1e9)
        hit = data.stalls.filter((pl.col("t_prev_ns") < hi) & (pl.col("t_ns") > lo))
        streams = max(1, layout(data)[1])
        how = (f"in {span.steps} engine step{'s' if span.steps != 1 else ''} over {fmt_s(span.end_s - span.start_s)}"
               if span.steps else f"over {fmt_s(span.end_s - span.start_s)} (client view)")
        size = f"{fmt_tokens(span.prompt_tokens)} tokens" if span.prompt_tokens else "injected"
        if hit.height:
            victims = hit["request_id"].n_unique()
            who = f"all {streams} steady streams" if victims >= streams else f"{victims} of {streams} steady streams"
            out.append(marks.flag(f"While {span.request_id} ({size}) was prefilled {how}, {who} froze: {hit.height:,} "
                                  f"stalled gaps, the worst {fmt_s(hit['gap_s'].max())}.",  # type: ignore[arg-type]
                                  "stalls", "the stalls"))
        else:
            out.append(marks.flag(f"{span.request_id} ({size}) was prefilled {how} without stalling any steady stream "
                                  f"(a stall: {StallParams.from_meta(data.doc).rule()}).", "stalls", "the stalls"))
        if span.ttft_s is not None:
            out.append(marks.flag(f"Its own first token came after {fmt_s(span.ttft_s)}.", "ttft_by_class_s.injected",
                                  f"{span.request_id}'s TTFT"))
        if len(spans) > 1:
            out.append(f"({len(spans)} prompts were injected; the figures shade every one.)")
    elif stalls.get("count"):
        out.append(marks.flag(f"{stalls['count']:,} stalled gaps in {stalls.get('victims', 0):,} requests, worst "
                              f"{fmt_s(stalls.get('worst_s'))}; no prompt was injected.", "stalls", "the stalls"))
    else:
        out.append(marks.flag(f"No stream stalled (a stall: {StallParams.from_meta(data.doc).rule()}) and no prompt "
                              "was injected.", "stalls", "the stalls"))
    itl = s.get("itl_s") or {}
    thr = (s.get("throughput") or {}).get("output_tokens_per_s")
    out.append(marks.flag("Steady streams' ITL", "itl_s", "ITL") + f": p50 {fmt_s(itl.get('p50'))}, p99 "
               f"{fmt_s(itl.get('p99'))}, p99.9 {fmt_s(itl.get('p999'))}, worst {fmt_s(itl.get('max'))}"
               + (marks.flag(f"; {thr:,.0f} output tokens/s.", "throughput", "throughput") if thr is not None else "."))
    return " ".join(out + marks.why())


def callouts(data: RunData) -> list[Callout]:
    out = []
    if data.cut_short:
        out.append(Callout("bad", "This run was cut short: " + "; ".join(data.cut_short)
                           + ". Everything below covers only what it recorded."))
    s = data.summary
    if (lost := unreadable_line(s)) is not None:
        out.append(Callout("bad", lost + "."))
    req = s.get("requests") or {}
    if req.get("total"):
        line, verdict = headline(data), _verdict(s)
        # an invalid run says so before it states any figure, and its headline is no plain statement of fact
        out += [verdict, Callout("warn", line)] if s.get("valid") is False else [Callout("info", line), verdict]
    else:  # no headline and no verdict on figures that are not there
        warmup = (f" ({req['outside_window']:,} were sent in the warm-up, {req.get('outside_window_failed', 0):,} "
                  f"of them failed)" if req.get("outside_window") else "")
        out.append(Callout("bad", f"Nothing was measured: no request fell in the measured window{warmup}."))
    if isinstance(s.get("sim_check"), dict):
        from itlbench.sim.accuracy import check_is_loose, check_line  # simulated runs only

        level = "warn" if check_is_loose(s["sim_check"]) else "info"
        out.append(Callout(level, f"How far to trust the simulator: {check_line(s['sim_check'])}."))
    warning = (s.get("bundling") or {}).get("warning")
    if warning:
        out.append(Callout("warn", warning))
    together = (s.get("arrived_together") or {}).get("warning")
    if together:
        out.append(Callout("warn", together))
    out += [Callout("info", w) for w in (s.get("cache") or {}).get("warnings") or []
            if "preemptions in the window" in w]
    out += [Callout("warn", w) for w in serving_warnings(data.doc)]
    if data.engine.external:
        out.append(Callout("info", f"External engine: {data.engine.name} (identified by "
                                   f"{data.engine.detected_from}); server-side figures from {data.engine.source}."))
    return out



def _verdict(s: dict[str, Any]) -> Callout:
    """Whether the client kept up (or what bent the figures); on a virtual clock, that no client was there."""
    validity = s.get("validity") or {}
    if s.get("valid") is False:
        standing = validity.get("standing") or []
        outside = validity.get("disturbances") or []
        client = [r for r in validity.get("reasons") or [] if r not in outside]
        said = ([f"the client may have been the bottleneck: {'; '.join(client)}"] if client else []) + \
            ([f"the path to the engine was disturbed: {'; '.join(outside)}"] if outside else [])
        return Callout("bad", "INVALID run: " + "; and ".join(said) + "."
                       + (f" Figures that still stand: {', '.join(standing)}." if standing else ""))
    if (s.get("clock") or {}).get("kind") == "virtual":
        return Callout("info", "Simulated time (virtual clock): every figure is the simulated engine's, with no "
                               "client, network or server in it; the client-side checks (send lag, event-loop "
                               "lag, client CPU) do not apply.")
    f = validity.get("figures") or {}
    return Callout("ok", f"Valid run: the client kept up ({send_lag(f)}, {loop_lag(f)}, "
                         f"client CPU mean {f.get('cpu_mean_percent') or 0:.0f} % of a core).")


def reproduce_section(data: RunData) -> Section:
    doc = data.doc
    sec = Section("Reproduce this run")
    cmd = reproduce_command(doc)
    if cmd:
        sec.add("The command line that reproduces it (every setting written out):", Code(cmd))
    if doc.get("argv"):
        sec.add("It was started as:", Code(" ".join(str(a) for a in doc["argv"])))
    sec.add(f"Engine: {data.engine.name} (identified by {data.engine.detected_from}); server-side figures from "
            f"{data.engine.source}. Run created {doc.get('created', '?')}, itlbench {doc.get('itlbench_version', '?')}.")
    config = data.config
    if config.get("slo") is None and slo_text(data.summary):  # '—' would hide that goodput used targets
        config["slo"] = "none given: the default SLOs applied (listed as 'SLOs judged' under The run in numbers)"
    sec.add(kv_table("Settings (run.json config)", config, skip=("out", "reports_dir", "live", "engine")))
    if data.engine_config:
        sec.add(kv_table("Engine (scheduler and model)", data.engine_config, skip=("extra",)))
    model = ((doc.get("engine") or {}).get("model")) or {}
    if isinstance(model, dict) and model:
        sec.add(kv_table("Model", model, skip=("rope_scaling",)))
    sec.add(kv_table("Versions", doc.get("versions") or {}), kv_table("Hardware", doc.get("hardware") or {}))
    return sec


def chunk_story(data: RunData) -> list[str]:
    """What the steps that prefilled the first injected prompt say, in words."""
    spans = injected_spans(data, whole_run=True)
    if not spans or not spans[0].steps:
        return []
    sid = data.tables["requests"].filter(pl.col("request_id") == spans[0].request_id)["server_request_id"][0]
    mine = (data.steps.filter(pl.col("prefill_request_ids").list.contains(sid))
            .with_columns(((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("dur_s")).sort("start_ns"))
    rid = spans[0].request_id
    if mine.height == 1:
        return [f"One engine step prefilled all of {rid} in {fmt_s(mine['dur_s'][0])}: no decode could run until it "
                "ended, so every stream waited that long for its next token."]
    first, longest = float(mine["dur_s"][0]), float(mine["dur_s"].max())  # type: ignore[arg-type]
    text = (f"{mine.height} steps prefilled {rid}, each a chunk of at most the token budget; every stream got one "
            "token per step, so its gaps are as long as the steps. "
            + (f"The first chunk was the longest, {fmt_s(first)}" if int(mine["dur_s"].arg_max() or 0) == 0 else
               f"The first chunk took {fmt_s(first)}, the longest {fmt_s(longest)}"))
    if longest > 1.5 * first:
        text += (f" ({longest / first:.1f}× the first): a chunk late in the prompt attends to everything "
                 "prefilled before it, so chunks get dearer as the prefix grows.")
    else:
        text += "."
    return [text]


def sweep_command(doc: dict[str, Any]) -> str:
    """The run's own command as a sweep over chunk budgets."""
    cmd = reproduce_command(doc).replace("itlbench run", "itlbench sweep", 1)
    cmd = re.sub(r" --chunk-budget \S+", "", cmd)
    return cmd.replace("itlbench sweep", "itlbench sweep --chunk-budget 512,2048,8192,none", 1)


FIGURE_FIGURES = {"stalls": "stalls", "ttft": "ttft_s", "itl_cdf": "itl_s", "throughput": "throughput",
                  "split": "split", "goodput": "goodput"}  # report figure → the summary figure it shows


def mark_withdrawn(data: RunData, figs: list[FigureSpec]) -> None:
    """Each figure showing what the validity verdict withdrew says so in its caption and on the image itself
    (figures/*.png travel without their caption)."""
    gone = Withdrawn.of(data.summary)
    for spec in figs:
        why = gone.why(FIGURE_FIGURES[spec.key]) if spec.key in FIGURE_FIGURES else None
        if why is None:
            continue
        spec.withdrawn = why
        if spec.figure is not None:
            spec.figure.suptitle(f"NOT VALID: {why}", x=0.01, ha="left", color=BAD_TEXT, fontsize=9,
                                 fontweight="bold")


def injected_prefill_line(check: dict[str, Any]) -> str:
    """An injected prompt's client TTFT beside the engine's prefill of it: '1 step', as the terminal says."""
    steps = check.get("prefill_steps")
    return (f"{check['request_id']} ({fmt_tokens(check.get('prompt_tokens'))} tokens): client TTFT "
            f"{fmt_s(check.get('client_ttft_s'))}, engine prefill span {fmt_s(check.get('engine_prefill_span_s'))} "
            f"over {steps} step{'' if steps == 1 else 's'}.")


def build_document(data: RunData) -> Document:
    figures = run_figures(data)
    mark_withdrawn(data, figures)
    figs = {f.key: f for f in figures}
    story = Section("What the streams saw").add(figs["stalls"])
    if (t := events_table(data)) is not None:
        story.add(t)
    why = Section("Why: the engine's steps").add(*chunk_story(data), figs["engine_steps"])
    check = ((data.summary.get("crosscheck") or {}).get("engine") or {}).get("injected") or []
    for c in check:
        why.add(injected_prefill_line(c))
    if data.engine_config and not data.engine.external and injected_spans(data):
        why.add("To weigh this stall against the long prompt's TTFT and the throughput, run the same workload at "
                "several budgets:", Code(sweep_command(data.doc)))
    sections = [
        Section("The run in numbers").add(totals_table(data)),
        story, why,
        Section("Time to first token").add(figs["ttft"], ttft_table(data),
                                           *filter(None, [queueing_sentence(data.summary)])),
        Section("Inter-token latency").add(figs["itl_cdf"], itl_table(data)),
        *([r] if (r := reasoning_section(data)) is not None else []),
        Section("Throughput, split and goodput").add(figs["throughput"], figs["split"], figs["goodput"],
                                                     *goodput_misses(data)),
        reproduce_section(data),
        Section("Definitions").add(Definitions([(DEFINITION_NAMES.get(k, k), first_sentence(v))
                                                for k, v in DEFINITIONS.items()])),
    ]
    subtitle = (f"{data.name} · {data.engine.name} · measured {data.window.seconds:.1f} s · "
                f"{_hardware_line(data.doc)}")
    return Document(title_of(data), subtitle, callouts(data) + inferred_callout(data, list(figs.values())), sections,
                    reproduce_command(data.doc))


def inferred_callout(data: RunData, figs: list[Any]) -> list[Callout]:
    """Which figures are inferred rather than logged (a run without a step log), said once at the top."""
    names = [f.title for f in figs if getattr(f, "inferred", False)]
    if not names:
        return []
    return [Callout("info", f"Inferred, not logged: {data.engine.name} publishes no step log, so "
                            f"{' and '.join(repr(n) for n in names)} {'are' if len(names) > 1 else 'is'} drawn from "
                            "engine steps reconstructed from the client's kernel receive stamps (accuracy against a "
                            "real step log: docs/perf/attribution.md). The stall causes here are the step-log "
                            f"attribution's; `itlbench analyze {data.run_dir} --attribution client` attributes them "
                            "on the inferred steps.")]


def _hardware_line(doc: dict[str, Any]) -> str:
    """The machine the figures describe: for a simulated run the GPUs it priced, then the host that ran it."""
    hw = doc.get("hardware") or {}
    gpu = hw.get("cuda")
    host = f"{hw.get('cpu_count', '?')} CPUs" + (f", {gpu}" if gpu else ", no GPU") + f", torch {hw.get('torch') or '?'}"
    sim = doc.get("sim_check")
    if not sim:
        return host
    tp = ((doc.get("engine") or {}).get("engine") or {}).get("tp") or 1
    gpus = f"{tp} × {sim['label']}" if tp > 1 else sim["label"]
    return f"simulated {gpus} in {sim['format']} (run on {host})"


def write_run_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Written:
    """Render one run's report into `out_dir` (default: the run directory itself)."""
    data = load_run(run_dir)
    return write_document(build_document(data), Path(out_dir) if out_dir else data.run_dir)




def write_run_report_safely(run_dir: str | Path) -> tuple[Path | None, str | None]:
    """For the end of a run: (report.html, None), or (None, why) — a report must never cost a run."""
    try:
        return write_run_report(run_dir).html, None
    except Exception as exc:  # noqa: BLE001 - the run's records and summary are already safe on disk
        return None, f"{type(exc).__name__}: {exc}"
