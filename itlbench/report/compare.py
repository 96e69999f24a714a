"""`itlbench compare DIR...`: finished runs side by side, one row each, and which setting to pick.

The seeds' trade-off in one table: the worst gap and ITL p99/p99.9 (what chunking buys) against the
injected prompt's TTFT and the output throughput (what it costs). Runs must share their workload,
seed and injection (else the rows answer different questions); `--force` compares them anyway.
The verdict judges each run against the `--slo` targets on its aggregate figures: ITL targets on the
steady streams' pooled gaps, TTFT targets on each class's p99 per prompt bucket.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from itlbench.analysis.buckets import BUCKET_LABELS
from itlbench.analysis.goodput import SloSet, parse_slo
from itlbench.analysis.stats import supported_quantile
from itlbench.errors import ConfigError
from itlbench.report.compare_ci import (
    METHOD,
    ci_json,
    ci_table,
    differences_table,
    noise_verdict,
    repeat_groups,
    repeated,
    rows_as_dicts,
    run_labels,
    swept_settings,
)
from itlbench.report.compare_figures import cdf_figure, gaps_figure, timelines_figure
from itlbench.report.data import RunData, load_run
from itlbench.report.document import Callout, Document, Links, Section, Table, Written, write_document
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.load_curve import load_axis, load_figure
from itlbench.report.reproduce import reproduce_command
from itlbench.report.style import RUN_COLORS, fmt_s, new_figure, tidy

# Settings that define the question a run answers; runs that differ in one answer different ones.
COMPARED = (("workload", "workload"), ("streams", "streams"), ("rate", "rate"), ("burstiness", "burstiness"),
            ("duration_s", "duration"), ("seed", "seed"), ("inject", "inject"),
            ("inject_max_tokens", "inject-max-tokens"), ("trace", "trace"), ("time_scale", "time-scale"))


@dataclass
class Row:
    """One run's figures for the comparison table."""

    run: RunData
    label: str
    worst_s: float | None
    p50_s: float | None
    p99_s: float | None
    p999_s: float | None
    injected_ttft_s: float | None
    ttft_p99_s: float | None
    out_tps: float | None
    stalls: int
    stalled_s: float | None
    goodput: float | None
    valid: bool | None
    group: str = ""  # the setting (repeats of one sweep point share it); label adds which run


def differing_settings(runs: list[RunData]) -> list[str]:
    """'seed (a: 0, b: 1)' for every compared setting whose value is not the same in every run."""
    out = []
    swept = swept_settings(runs)
    for key, name in COMPARED:
        if key in swept:
            continue
        values = [r.config.get(key) for r in runs]
        if any(v != values[0] for v in values[1:]):
            shown = ", ".join(f"{r.name}: {v}" for r, v in zip(runs, values, strict=True))
            out.append(f"{name} ({shown})")
    return out


def load_runs(dirs: list[Path], force: bool = False) -> list[RunData]:
    if len(dirs) < 1:
        raise ConfigError("DIR", "no run directory given", "pass one or more directories written by `itlbench run`")
    runs = [load_run(d) for d in dirs]
    diffs = differing_settings(runs)
    if diffs and not force:
        raise ConfigError("DIR", "the runs differ in " + "; ".join(diffs),
                          "compare runs of one seeded workload and injection, or pass --force")
    return runs


def _or_max(stats: dict[str, Any], key: str) -> float | None:
    """A percentile, or where too few samples withheld it, the worst sample (one injected prompt: its TTFT)."""
    if not stats.get("count"):
        return None
    value = stats.get(key)
    return value if value is not None else stats.get("max")


def make_rows(runs: list[RunData]) -> list[Row]:
    rows = []
    labels = run_labels(runs)
    for run, label, group in zip(runs, labels, repeat_groups(runs, labels), strict=True):
        s = run.summary
        itl, stalls = s.get("itl_s") or {}, s.get("stalls") or {}
        inj = (s.get("ttft_by_class_s") or {}).get("injected") or {}
        every = (s.get("ttft_s") or {}).get("all") or {}
        rows.append(Row(run, label, itl.get("max"), itl.get("p50"), itl.get("p99"), itl.get("p999"),
                        _or_max(inj, "p50"), _or_max(every, "p99"), (s.get("throughput") or {}).get("output_tokens_per_s"),
                        int(stalls.get("count") or 0), stalls.get("stalled_s"),
                        (s.get("goodput") or {}).get("requests_per_s"), s.get("valid") if measured(run) else None,
                        group))
    return rows


def measured(run: RunData) -> bool:
    """Whether any request fell in the run's measured window (a run aborted in its warm-up has none)."""
    return bool((run.summary.get("requests") or {}).get("total"))


def comparison_table(rows: list[Row]) -> Table:
    out = []
    for r in rows:
        out.append([r.label, fmt_s(r.worst_s), fmt_s(r.p50_s), fmt_s(r.p99_s), fmt_s(r.p999_s),
                    fmt_s(r.injected_ttft_s), "—" if r.out_tps is None else f"{r.out_tps:,.0f}",
                    f"{r.stalls:,}", fmt_s(r.stalled_s), "—" if r.goodput is None else f"{r.goodput:.2f}",
                    {True: "yes", False: "NO", None: "?"}[r.valid], r.run.engine.name, r.run.engine.source])
    return Table(["setting", "worst gap", "ITL p50", "ITL p99", "ITL p99.9", "injected TTFT", "output tok/s",
                  "stalls", "stalled", "goodput req/s", "valid", "engine", "server-side figures from"], out,
                 "One row per run (steady streams' ITL; injected TTFT is the median over injected prompts, or the "
                 "worst where they are too few for a median; — where too few samples support a percentile)")


@dataclass(frozen=True)
class Check:
    what: str
    target_s: float
    value_s: float | None

    @property
    def ok(self) -> bool:
        return self.value_s is not None and self.value_s <= self.target_s


def _stat(values: pl.Series) -> tuple[str, float | None]:
    """p99 where the samples support it, else the worst value (the conservative reading of p99)."""
    p99 = supported_quantile(values, 0.99)
    return ("p99", p99) if p99 is not None else ("max", values.max() if values.len() else None)  # type: ignore[return-value]


def slo_checks(run: RunData, slos: SloSet) -> list[Check]:
    """Each SLO target against the run's aggregate: ITL on pooled steady gaps, TTFT per class and bucket
    (p99 where the requests support one, else the worst request)."""
    checks = []
    default = slos.default
    itl = run.summary.get("itl_s") or {}
    if default.itl_s is not None:
        value = itl.get("max") if default.itl_stat == "max" else itl.get("p99")
        name = f"ITL {default.itl_stat}"
        if value is None and default.itl_stat == "p99":
            name, value = "ITL max (too few gaps for a p99)", itl.get("max")
        checks.append(Check(name, default.itl_s, value))
    t = run.ttft.filter(pl.col("ttft_s").is_not_null())
    for cls in sorted(t["cls"].drop_nulls().unique().to_list()):
        targets = slos.for_class(cls).ttft_s
        for bucket in BUCKET_LABELS:
            group = t.filter((pl.col("cls") == cls) & (pl.col("bucket") == bucket))
            if group.is_empty() or targets.get(bucket) is None:
                continue
            stat, value = _stat(group["ttft_s"])
            name = "injected TTFT" if cls == "injected" else f"{cls} TTFT {stat}"
            checks.append(Check(f"{name} ({bucket}, {group.height} requests)", float(targets[bucket]), value))  # type: ignore[arg-type]
    return checks


def _describe_miss(c: Check) -> str:
    return f"{c.what} {fmt_s(c.value_s)} > {fmt_s(c.target_s)}"


def verdict(rows: list[Row], slos: SloSet) -> list[str]:
    """Plain sentences: who meets every SLO, what the others miss, and what the smoothest setting costs."""
    lines = []
    meets, misses = [], []
    for r in (r for r in rows if measured(r.run)):
        failed = [c for c in slo_checks(r.run, slos) if not c.ok]
        (misses if failed else meets).append((r, failed))
    spec = slos.spec or "the default SLOs"
    how = "on the run's pooled figures; goodput counts requests one by one"  # the two can disagree: say which
    if meets:
        lines.append(f"Meets every SLO ({spec}; {how}): " + ", ".join(r.label for r, _ in meets) + ".")
    else:
        lines.append(f"No run meets every SLO ({spec}; {how}).")
    lines += _hidden_gaps([r for r, _ in meets], slos)
    for r, failed in misses:
        lines.append(f"{r.label} misses: " + "; ".join(_describe_miss(c) for c in failed[:4])
                     + (f" (+{len(failed) - 4} more)" if len(failed) > 4 else "") + ".")
    ranked = [r for r in rows if r.worst_s is not None]
    if repeated(rows):
        lines += noise_verdict(rows)
    elif len(ranked) >= 2:
        best = min(ranked, key=lambda r: (r.worst_s, r.p99_s or 0.0))
        text = f"Smoothest streams: {best.label} (worst gap {fmt_s(best.worst_s)}, ITL p99 {fmt_s(best.p99_s)})."
        ttft_rows = [r for r in rows if r.injected_ttft_s is not None]
        if best.injected_ttft_s is not None and ttft_rows:
            fastest = min(ttft_rows, key=lambda r: r.injected_ttft_s)  # type: ignore[arg-type,return-value]
            if fastest is not best:
                text += (f" It costs the injected prompt {fmt_s(best.injected_ttft_s - fastest.injected_ttft_s)} "  # type: ignore[operator]
                         f"of TTFT against {fastest.label} ({fmt_s(best.injected_ttft_s)} vs "
                         f"{fmt_s(fastest.injected_ttft_s)})")
            else:
                text += " It also gives the injected prompt its fastest TTFT"
        tps_rows = [r for r in rows if r.out_tps]
        if best.out_tps and tps_rows:
            top = max(tps_rows, key=lambda r: r.out_tps)  # type: ignore[arg-type,return-value]
            if top is not best:
                loss = 1 - best.out_tps / top.out_tps  # type: ignore[operator]
                text += (f" and {loss:.0%} of output throughput against {top.label} "
                         f"({best.out_tps:,.0f} vs {top.out_tps:,.0f} tokens/s).")
            else:
                text += " and loses no output throughput (it has the highest)."
        elif not text.endswith("."):
            text += "."
        lines.append(text + " (One run per setting: no noise estimate; --repeat 3 gives one.)")
    invalid = [r.label for r in rows if r.valid is False]
    if invalid:
        lines.append("Treat with care (the client may have been the bottleneck): " + ", ".join(invalid) + ".")
    cut = [r.label for r in rows if r.run.cut_short]
    if cut:
        lines.append("Cut short: " + ", ".join(cut) + ".")
    if empty := [r.label for r in rows if not measured(r.run)]:
        lines.append("Measured nothing (no request fell in its window; its report says why): " + ", ".join(empty) + ".")
    return lines + _sim_checks(rows)


def _hidden_gaps(passing: list[Row], slos: SloSet) -> list[str]:
    """Runs that meet an ITL p99 target while a steady stream froze for longer than it: a stall of a few tokens per
    stream sits above the 99th percentile of thousands, so the verdict says so and names the SLO that would judge it."""
    slo = slos.default
    if slo.itl_stat != "p99" or not slo.itl_s:
        return []
    hidden = [r for r in passing if r.worst_s is not None and r.worst_s > slo.itl_s]
    if not hidden:
        return []
    runs = ", ".join(f"{r.label} (worst gap {fmt_s(r.worst_s)}, ITL p99 {fmt_s(r.p99_s)})" for r in hidden)
    return [f"Yet a steady stream waited longer than the {fmt_s(slo.itl_s)} ITL target in {runs}: a p99 leaves out the "
            f"few longest gaps, so --slo itl_max=DUR judges the worst one."]


def _sim_checks(rows: list[Row]) -> list[str]:
    """Simulated runs: the presets' published error bars, once per distinct one (a sweep shares one)."""
    checks = [(r.label, c) for r in rows if isinstance(c := r.run.summary.get("sim_check"), dict)]
    if not checks:
        return []
    from itlbench.sim.accuracy import check_line  # only when a run was simulated

    seen: dict[str, list[str]] = {}
    for label, check in checks:
        seen.setdefault(check_line(check), []).append(label)
    if len(seen) == 1:
        return [f"Simulated: {next(iter(seen))}."]
    return [f"Simulated ({', '.join(labels)}): {line}." for line, labels in seen.items()]


def tradeoff_figure(rows: list[Row]) -> FigureSpec:
    inj = all(r.injected_ttft_s is not None for r in rows)
    ylabel = "injected prompt's TTFT (s)" if inj else "TTFT p99, all requests (s)"
    spec = FigureSpec("compare_tradeoff", "The trade-off",
                      f"Each run's worst gap (what the steady streams suffered) against the {ylabel.split(' (')[0]} "
                      "(what the long prompt paid); labels give the output throughput.")
    pts = [(r, r.worst_s, r.injected_ttft_s if inj else r.ttft_p99_s) for r in rows]
    pts = [(r, x, y) for r, x, y in pts if x is not None and y is not None]
    if not pts:
        spec.note = "No run has both a worst gap and a TTFT to plot."
        return spec
    fig: Figure = new_figure(3.8, 8.0)
    ax = fig.subplots()
    for i, (r, x, y) in enumerate(pts):
        ax.scatter([x], [y], s=60, color=RUN_COLORS[i % len(RUN_COLORS)], zorder=3)
        tps = f", {r.out_tps:,.0f} tok/s" if r.out_tps else ""
        ax.annotate(f"{r.label}{tps}", (x, y), xytext=(6, 4), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_s(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("worst gap in any steady stream (log)")
    ax.set_ylabel(ylabel)
    ax.margins(x=0.3, y=0.2)
    tidy(ax)
    spec.figure = fig
    return spec


def run_links(rows: list[Row], out_dir: Path) -> Links:
    """Each run's own report, relative to the comparison's directory."""
    return Links([(f"{r.label}: its own report",
                   os.path.relpath((r.run.run_dir / "report").resolve(), out_dir.resolve())) for r in rows])


def build_compare_document(runs: list[RunData], slos: SloSet, title: str = "Comparison",
                           command: str = "", out_dir: Path | None = None, missing: list[str] | None = None) -> Document:
    rows = make_rows(runs)
    labels = [r.label for r in rows]
    groups = [r.group for r in rows]
    lines = verdict(rows, slos) + list(missing or [])
    diffs = differing_settings(runs)
    callouts = [Callout("info", " ".join(line for line in lines if line.startswith(("Meets", "No run", "Yet a steady",
                                                                                 "Smoothest", "No setting"))))]
    if missing:
        callouts.append(Callout("warn", " ".join(missing)))
    if diffs:
        callouts.insert(0, Callout("warn", "Compared with --force although the runs differ in "
                                   + "; ".join(diffs) + "."))
    base = runs[0].config
    what = f"{base.get('workload')}, seed {base.get('seed')}" + (f", inject {base['inject']}" if base.get("inject")
                                                                  else "")
    sections = [
        Section("Verdict").add(*lines),
        Section("The runs").add(comparison_table(rows)),
        *([Section("Repeats: means, intervals, and which differences are real").add(
            ci_table(rows), differences_table(rows))] if repeated(rows) else []),
        *([Section("Latency against load").add(load_figure(runs, rows))] if load_axis(runs) else []),
        Section("Where the streams froze").add(timelines_figure(runs, labels), gaps_figure(runs, labels, groups)),
        Section("Inter-token latency").add(cdf_figure(runs, labels, groups), tradeoff_figure(rows)),
        Section("Runs compared").add(Table(["setting", "directory", "command"],
                                           [[r.label, str(r.run.run_dir), reproduce_command(r.run.doc)]
                                            for r in rows], align_right_from=9)),
    ]
    if out_dir is not None:
        sections[-1].add(run_links(rows, out_dir))
    return Document(f"{title}: {what}", f"{len(runs)} runs · {runs[0].engine.name} · "
                    f"written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}", callouts, sections, command)


def write_compare_report(dirs: list[Path], out_dir: Path, slo: str | None = None, force: bool = False,
                         title: str = "Comparison", command: str = "",
                         missing: list[str] | None = None) -> tuple[Written, list[Row], list[str]]:
    """The report and compare.json (rows, verdict, ci95 per setting and figure, every pairwise difference's
    verdict, and the points a sweep could not measure)."""
    runs = load_runs(dirs, force)
    slos = parse_slo(slo)
    doc = build_compare_document(runs, slos, title, command, out_dir, missing)
    rows = make_rows(runs)
    written = write_document(doc, out_dir)
    lines = verdict(rows, slos) + list(missing or [])
    from itlbench.report.compare_ci import all_differences

    (out_dir / "compare.json").write_text(json.dumps({
        "rows": rows_as_dicts(rows), "verdict": lines, "ci95": ci_json(rows), "ci_method": METHOD,
        "differences": [d.as_dict() for d in all_differences(rows)], "missing": list(missing or [])},
        indent=2, default=str) + "\n")
    return written, rows, lines
