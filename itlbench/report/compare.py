"""`itlbench compare DIR...`: finished runs side by side, one row each, and which setting to pick.

The seeds' trade-off in one table: the worst gap and ITL p99/p99.9 (what chunking buys) against the
injected prompt's TTFT and the output throughput (what it costs). Runs must share their workload,
seed and injection (else the rows answer different questions); `--force` compares them anyway.
The verdict judges each run against the `--slo` targets on its aggregate figures: ITL targets on the
steady streams' pooled gaps, TTFT targets on each class's p99 per prompt bucket. The report and the terminal
open with the answer (`compare_pick.answer`: which setting to pick, and why); the verdict keeps the full sentences.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from matplotlib.figure import Figure

from itlbench.analysis.goodput import SloSet, parse_slo
from itlbench.report.compare_ci import (
    METHOD,
    ci_json,
    ci_table,
    differences_table,
    noise_verdict,
    repeated,
    rows_as_dicts,
)
from itlbench.report.compare_figures import cdf_figure, gaps_figure, timelines_figure
from itlbench.report.compare_pick import (
    answer,
    describe_misses,
    distinct_durations,
    gap_figures,
    judged,
    meeting_instead,
    paused_others,
    smoothest_meeting,
    smoothness,
)
from itlbench.report.compare_rows import Row, make_rows, measured
from itlbench.report.compare_runs import differing_settings, load_runs
from itlbench.report.data import RunData
from itlbench.report.document import Callout, Document, Links, Section, Table, Written, write_document
from itlbench.report.figure_spec import FigureSpec
from itlbench.report.load_curve import load_axis, load_figure
from itlbench.report.queueing import queueing_sentence
from itlbench.report.reproduce import reproduce_command
from itlbench.report.slos import judges_nothing, slo_set_words, slo_text
from itlbench.report.style import RUN_COLORS, fmt_s, new_figure, seconds_log_xaxis, seconds_yaxis, tidy
from itlbench.report.withdrawn import Withdrawn


def comparison_table(rows: list[Row]) -> Table:
    out = []
    for r in rows:
        out.append([r.label, fmt_s(r.worst_s), fmt_s(r.p50_s), fmt_s(r.p99_s), fmt_s(r.p999_s), fmt_s(r.ttft_p99_s),
                    fmt_s(r.injected_ttft_s), "—" if r.out_tps is None else f"{r.out_tps:,.0f}",
                    r.stalls_text(), fmt_s(r.stalled_s), "—" if r.goodput is None else f"{r.goodput:.2f}",
                    {True: "yes", False: "NO", None: "?"}[r.valid], r.run.engine.name, r.run.engine.source])
    return Table(["setting", "worst gap", "ITL p50", "ITL p99", "ITL p99.9", "TTFT p99", "injected TTFT", "output tok/s",
                  "stall events", "stalled", "goodput req/s", "valid", "engine", "server-side figures from"], out,
                 "One row per run (steady streams' ITL; TTFT p99 over every request, or the worst where too few; "
                 "injected TTFT is the median over injected prompts, or the "
                 "worst where they are too few for a median; — where too few samples support a percentile; "
                 f"{_goodput_slos(rows)})")


def _goodput_slos(rows: list[Row]) -> str:
    """What the goodput column was judged against: each run's own SLOs when it ran (not this comparison's
    --slo), the defaults said as such."""
    texts = list(dict.fromkeys(t for r in rows if (t := slo_text(r.run.summary)) is not None))
    if len(texts) == 1:
        return f"goodput as each run judged it, against {texts[0]}"
    return ("goodput as each run judged it, against its own SLOs, which differ between the runs (each run's report "
            "lists them)")


def runs_list(labels: list[str]) -> str:
    """Run labels in a sentence, joined by '; ': a label may hold a comma ('budget 512, prefill-first'), so
    commas between labels would hide how many runs the list names."""
    return "; ".join(labels)


def verdict(rows: list[Row], slos: SloSet) -> list[str]:
    """Plain sentences: who meets every SLO, what the others miss, and what the smoothest setting costs."""
    lines = []
    meets, misses = judged(rows, slos)
    spec = slo_set_words(slos)
    how = "on the run's pooled figures; goodput counts requests one by one"  # the two can disagree: say which
    if judges_nothing(slos):
        lines.append(f"No SLO is judged ({spec}).")
    elif meets:
        lines.append(f"Meets every SLO ({spec}; {how}): " + runs_list([r.label for r, _ in meets]) + ".")
    else:
        lines.append(f"No run meets every SLO ({spec}; {how}).")
    lines += _hidden_gaps([r for r, _ in meets], slos)
    for r, failed in misses:
        held = queueing_sentence(r.run.summary) if any(c.figure.startswith("ttft") for c in failed) else None
        lines.append(f"{r.label} misses: {describe_misses(failed)}." + (f" {held}" if held else ""))
    ranked = [r for r in rows if r.rank_s() is not None]
    if repeated(rows):
        lines += noise_verdict(rows)
    elif len(ranked) >= 2:
        best = min(ranked, key=smoothness)
        picked = smoothest_meeting([r for r, _ in meets], ranked) is best  # the answer above gave its figures
        lines.append(smoothest_sentence(best, rows, picked) + paused_others(best, ranked)
                     + meeting_instead(best, [r for r, _ in meets], ranked)
                     + " (One run per setting: no noise estimate; --repeat 3 gives one.)")
    invalid = [r.label for r in rows if r.valid is False]
    if invalid:
        lines.append("Treat with care (the client may have been the bottleneck): " + runs_list(invalid) + ".")
    for r in (r for r in rows if r.run.cut_short and measured(r.run)):  # its row covers the window it measured
        lines.append(f"Cut short: {r.label}: {'; '.join(r.run.cut_short)}; its row covers only that.")
    if empty := [r.label for r in rows if not measured(r.run)]:
        lines.append("Measured nothing (no request fell in its window; its report says why): " + runs_list(empty) + ".")
    return lines + _sim_checks(rows)


def _ttft_clause(best: Row, rows: list[Row]) -> tuple[str, bool] | None:
    """What the smoothest run did to the injected prompt's TTFT against the fastest other run, and whether that
    is good news (None without an injection or another run to hold it against)."""
    others = [r for r in rows if r is not best and r.injected_ttft_s is not None]
    if best.injected_ttft_s is None or not others:
        return None
    fastest = min(others, key=lambda r: r.injected_ttft_s)  # type: ignore[arg-type,return-value]
    mine, theirs = best.injected_ttft_s, fastest.injected_ttft_s
    assert theirs is not None
    a, b = distinct_durations(mine, theirs)
    if theirs < mine:
        return (f"costs the injected prompt {fmt_s(mine - theirs)} of TTFT against {fastest.label} "
                f"({a} vs {b})"), False
    if theirs == mine:
        return f"gives the injected prompt as fast a TTFT as {fastest.label} ({a})", True
    return f"gives the injected prompt its fastest TTFT ({a} vs {b} for {fastest.label})", True


def _share(x: float) -> str:
    """A share as a percentage that a small loss does not round away to '0%'."""
    if x >= 0.01:
        return f"{x:.0%}"
    return f"{x:.1%}" if x >= 0.001 else "under 0.1%"


def _throughput_clause(best: Row, rows: list[Row]) -> tuple[str, bool] | None:
    """The smoothest run's output throughput against the highest other run's: what it loses, or that it has the
    most (None where it or every other run has none)."""
    others = [r for r in rows if r is not best and r.out_tps]
    if not best.out_tps or not others:
        return None
    top = max(others, key=lambda r: r.out_tps)  # type: ignore[arg-type,return-value]
    mine, theirs = best.out_tps, top.out_tps
    assert theirs is not None
    if theirs > mine:
        places = next((d for d in range(3) if f"{mine:,.{d}f}" != f"{theirs:,.{d}f}"), 2)  # 999.6 vs 1,000.0
        return (f"loses {_share(1 - mine / theirs)} of output throughput against {top.label} "
                f"({mine:,.{places}f} vs {theirs:,.{places}f} tokens/s)"), False
    if theirs == mine:
        return f"matches the highest output throughput ({mine:,.0f} tokens/s, as does {top.label})", True
    return f"has the highest output throughput ({mine:,.0f} vs {theirs:,.0f} tokens/s for {top.label})", True


def smoothest_sentence(best: Row, rows: list[Row], picked: bool = False) -> str:
    """'Smoothest streams: X (...).' and what that setting costs or gains in TTFT and throughput, as one sentence
    with its own verb per clause, 'but' between a gain and a loss. `picked`: X is the answer's pick, whose line
    gave the same figures just before, so they are not said twice."""
    figure = "itl_s.max_not_client" if best.paused() else "itl_s.max"  # the one that ranked it
    mark = Withdrawn.of(best.run.summary).mark(figure) if best.run is not None else ""
    text = (f"Smoothest streams: {best.label}, the pick." if picked and not mark
            else f"Smoothest streams: {best.label} ({gap_figures(best, mark)}).")
    clauses = [c for c in (_ttft_clause(best, rows), _throughput_clause(best, rows)) if c is not None]
    if not clauses:
        return text
    said = clauses[0][0]
    if len(clauses) == 2:
        said += (" and " if clauses[0][1] == clauses[1][1] else " but ") + clauses[1][0]
    return f"{text} It {'also ' if clauses[0][1] else ''}{said}."


def _hidden_gaps(passing: list[Row], slos: SloSet) -> list[str]:
    """Runs that meet an ITL p99 target while a steady stream froze for longer than it: a stall of a few tokens per
    stream sits above the 99th percentile of thousands, so the verdict says so and names the SLO that would judge it."""
    slo = slos.default
    if slo.itl_stat != "p99" or not slo.itl_s:
        return []
    hidden = [r for r in passing if r.worst_s is not None and r.worst_s > slo.itl_s]
    if not hidden:
        return []
    runs = runs_list([f"{r.label} (worst gap {distinct_durations(r.worst_s, slo.itl_s)[0]}, ITL p99 {fmt_s(r.p99_s)})"
                      for r in hidden])
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
    if len(seen) == 1 and len(checks) == len(rows):  # every run simulated alike: the note is about all of them
        return [f"Simulated: {next(iter(seen))}."]
    return [f"Simulated ({runs_list(labels)}): {line}." for line, labels in seen.items()]


def tradeoff_figure(rows: list[Row]) -> FigureSpec:
    inj = all(r.injected_ttft_s is not None for r in rows)
    ylabel = "injected prompt's TTFT" if inj else "TTFT p99, all requests"
    spec = FigureSpec("compare_tradeoff", "The trade-off",
                      f"Each run's worst gap (what the steady streams suffered) against the {ylabel} "
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
        # the throughput on a line of its own: after a comma it would read as part of a label that has commas
        tps = f"\n{r.out_tps:,.0f} tok/s" if r.out_tps else ""
        ax.annotate(f"{r.label}{tps}", (x, y), xytext=(6, 4), textcoords="offset points", fontsize=8)
    seconds_log_xaxis(ax)  # durations on every tick, minor ones too where the gaps lie within a decade
    seconds_yaxis(ax, [y for _, _, y in pts])
    ax.set_xlabel("worst gap in any steady stream (log)")
    ax.set_ylabel(ylabel)
    ax.margins(x=0.3)
    tidy(ax)
    spec.figure = fig
    return spec


def run_links(rows: list[Row], out_dir: Path) -> Links:
    """Each run's own report, relative to the comparison's directory."""
    return Links([(f"{r.label}: its own report",
                   os.path.relpath((r.run.run_dir / "report").resolve(), out_dir.resolve())) for r in rows])


def build_compare_document(runs: list[RunData], slos: SloSet, title: str = "Comparison",
                           command: str = "", out_dir: Path | None = None, missing: list[str] | None = None,
                           notes: list[str] | None = None) -> Document:
    """`missing`: the points a sweep could not measure (a warning); `notes`: how it ran, where that bears on the
    verdict (its repeats' order)."""
    rows = make_rows(runs)
    labels = [r.label for r in rows]
    groups = [r.group for r in rows]
    lines = verdict(rows, slos) + list(notes or []) + list(missing or [])
    short = [line for line in lines if line.startswith("Cut short: ")]
    diffs = differing_settings(runs)
    said = answer(rows, slos)  # the top of the report answers which setting to pick; the verdict says the rest
    callouts = [] if said is None else [Callout("info" if said.startswith("Pick ") else "warn", said)]
    if notes:
        callouts.append(Callout("info", " ".join(notes)))
    if short:
        callouts.append(Callout("warn", " ".join(short)))
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
    engines = " / ".join(dict.fromkeys(r.engine.name for r in runs))  # every engine compared, not the first alone
    return Document(f"{title}: {what}", f"{len(runs)} runs · {engines} · "
                    f"written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}", callouts, sections, command)


def answered(said: str | None, lines: list[str]) -> list[str]:
    """The verdict as the terminal says it: the answer first, unless a line says it already. Where no setting meets
    every SLO, the answer (which names the SLOs) stands for the line that says no run does: never twice."""
    if said is None or said in lines:
        return lines
    if said.startswith("No setting meets every SLO"):
        lines = [line for line in lines if not line.startswith("No run meets every SLO")]
    return [said, *lines]


def write_compare_report(dirs: list[Path], out_dir: Path, slo: str | None = None, force: bool = False,
                         title: str = "Comparison", command: str = "",
                         missing: list[str] | None = None,
                         notes: list[str] | None = None) -> tuple[Written, list[Row], list[str]]:
    """The report and compare.json (rows, the one-line answer, verdict, ci95 per setting and figure, every pairwise
    difference's verdict, and the points a sweep could not measure); the verdict's lines as the terminal prints
    them, the answer first."""
    runs = load_runs(dirs, force)
    slos = parse_slo(slo)
    doc = build_compare_document(runs, slos, title, command, out_dir, missing, notes)
    rows = make_rows(runs)
    written = write_document(doc, out_dir)
    said = answer(rows, slos)
    lines = answered(said, verdict(rows, slos) + list(notes or []) + list(missing or []))
    from itlbench.report.compare_ci import all_differences

    (out_dir / "compare.json").write_text(json.dumps({
        "rows": rows_as_dicts(rows), "answer": said, "verdict": lines, "ci95": ci_json(rows), "ci_method": METHOD,
        "differences": [d.as_dict() for d in all_differences(rows)], "missing": list(missing or [])},
        indent=2, default=str) + "\n")
    return written, rows, lines
