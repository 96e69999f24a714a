"""Commands over finished run directories: `analyze`, `report`, `compare`."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from itlbench.cli.app import AsJson, app, console, fail, print_json, write_report
from itlbench.errors import ConfigError, ItlbenchError


@app.command()
def analyze(run_dir: Annotated[Path, typer.Argument(help="A run directory written by `itlbench run`.")],
            as_json: AsJson = False,
            attribution: Annotated[str, typer.Option(
                help="engine (the step log where there is one); client: recompute from the client's records "
                     "alone (inferred steps) into summary-client.json; otel: stalls from vLLM's OpenTelemetry "
                     "request spans (--spans) into summary-otel.json.")] = "engine",
            spans: Annotated[Path | None, typer.Option(
                help="With --attribution otel: the spans, one JSON object a line (default RUN_DIR/otel_spans.jsonl)."
            )] = None,
            server_log: Annotated[Path | None, typer.Option(
                help="SGLang's server log: its prefill batches (second-resolution stamps) laid beside the "
                     "client-only attribution's events, into server-log.json.")] = None) -> None:
    """Recompute summary.json from a run directory's records (e.g. after an interrupted run)."""
    from itlbench.analysis.summary import analyze_run
    from itlbench.report.terminal import cut_short, engine_warnings, print_summary

    _require_run(run_dir)
    if attribution not in ("engine", "client", "otel"):
        fail(ConfigError("--attribution", f"{attribution!r} is not a source", "use engine, client or otel"))
    if spans is not None and attribution != "otel":  # was read by nothing: the user thought the spans were used
        fail(ConfigError("--spans", f"only applies to --attribution otel, not {attribution}",
                         "add --attribution otel, or drop --spans"))
    if server_log is not None:
        if attribution == "otel":
            fail(ConfigError("--server-log", "lays SGLang's batches beside the client-only attribution, not the "
                             "OpenTelemetry spans'", "run `itlbench analyze` once with --server-log and once with "
                             "--attribution otel"))
        _analyze_server_log(run_dir, server_log, as_json)
        return
    if attribution == "otel":
        _analyze_otel(run_dir, spans, as_json)
        return
    if attribution == "client":
        _analyze_client(run_dir, as_json)
        return
    summary = _summary_written(run_dir, analyze_run, "summary.json")
    if not as_json:
        print_summary(console, summary, run_dir)
    write_report(run_dir)
    if as_json:
        print_json({"run_dir": str(run_dir), "summary": summary, "warnings": engine_warnings(run_dir),
                    "cut_short": cut_short(summary, run_dir)})
    else:
        print(run_dir)


def _require_run(run_dir: Path, flag: str = "RUN_DIR") -> None:
    """A run directory with its records, else one line saying what is missing (never a summary of nothing)."""
    from itlbench.rundir.reader import not_a_run, require_records  # polars: loaded where runs are read

    if not (run_dir / "run.json").is_file():
        fail(not_a_run(run_dir, flag))
    try:
        require_records(run_dir, flag)
    except ConfigError as exc:
        fail(exc)


def _analyze_client(run_dir: Path, as_json: bool) -> None:
    """`analyze --attribution client`: summary-client.json beside summary.json (which stays as it is)."""
    from itlbench.analysis.client_summary import analyze_run_client

    def line(summary: dict[str, Any]) -> str:
        inferred = summary["stalls"].get("inferred") or {}
        return (f"Stalls and split inferred from client records alone ({inferred.get('steps', 0)} inferred steps, "
                "attribution_source client_inferred); unknown causes say why in summary-client.json")

    _analyze_beside(run_dir, analyze_run_client, "summary-client.json", "client_inferred", line, as_json)


def _analyze_otel(run_dir: Path, spans: Path | None, as_json: bool) -> None:
    """`analyze --attribution otel`: summary-otel.json, stalls attributed on vLLM's request spans."""
    from itlbench.analysis.otel_attribution import analyze_run_otel

    def line(summary: dict[str, Any]) -> str:
        found = summary["stalls"].get("spans") or {}
        return (f"Stalls attributed on vLLM's request spans ({found.get('matched', 0)} of "
                f"{found.get('received', 0)} spans matched, attribution_source vllm_otel)")

    _analyze_beside(run_dir, lambda d: analyze_run_otel(d, spans), "summary-otel.json", "vllm_otel", line, as_json)


def _analyze_server_log(run_dir: Path, log: Path, as_json: bool) -> None:
    """`analyze --server-log FILE`: server-log.json, SGLang's logged prefill batches beside the events."""
    from itlbench.analysis.sglang_log import analyze_server_log, summary_line

    doc = _summary_written(run_dir, lambda d: analyze_server_log(d, log), "server-log.json")
    if as_json:
        print_json({"run_dir": str(run_dir), "server_log": doc})
        return
    console.print(summary_line(doc), highlight=False)
    print(run_dir / "server-log.json")


def _analyze_beside(run_dir: Path, compute: Callable[[Path], dict[str, Any]], name: str, source: str,
                    line: Callable[[dict[str, Any]], str], as_json: bool) -> None:
    """A summary from another attribution source, written as `name` beside summary.json (untouched)."""
    from itlbench.report.terminal import print_summary

    summary = _summary_written(run_dir, compute, name)
    if as_json:
        print_json({"run_dir": str(run_dir), "summary": summary, "attribution": source})
        return
    print_summary(console, summary, run_dir)
    console.print(line(summary), highlight=False)
    print(run_dir / name)


def _summary_written(run_dir: Path, compute: Callable[[Path], dict[str, Any]], name: str) -> dict[str, Any]:
    """The summary `compute` makes of run_dir, written beside its records as `name`; a bad run dir
    is a one-line error."""
    from itlbench.rundir.store import RunStore

    try:
        summary = compute(run_dir)
    except ItlbenchError as exc:
        fail(exc)
    try:
        RunStore(run_dir).write_json(name, summary)
    except OSError as exc:  # a run shared read-only: its figures still print
        console.print(f"[yellow]warning:[/] {name} not saved ({exc.strerror or exc}: {run_dir}); the figures "
                      "printed are complete", highlight=False)
    return summary


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory written by `itlbench run`.")],
           out: Annotated[Path | None, typer.Option(help="Write the report here (default: RUN_DIR); not a directory that holds "
                                       "another run, sweep, capacity search or comparison.")] = None) -> None:
    """Write report.html (self-contained) and report.md with figures/ for one run."""
    from itlbench.report.run_report import write_run_report

    _require_run(run_dir)
    if out is not None:
        _check_report_out(out, run_dir)
    try:
        written = write_run_report(run_dir, out)
    except ItlbenchError as exc:
        fail(exc)
        return
    except OSError as exc:  # a read-only run directory, a full disk
        fail(ConfigError("--out", f"cannot write the report into {out or run_dir} ({exc.strerror or exc})",
                         "pass --out DIR to write it elsewhere"))
        return
    console.print(f"[bold]Report[/] {written.html}  (markdown: {written.markdown})", highlight=False)
    print(written.html)


def _check_report_out(out: Path, run_dir: Path) -> None:
    """Refuse an --out that holds another run, a sweep, a capacity search, a phases study or a comparison: their
    report.html and report.md would be replaced by this run's, and read as theirs."""
    from itlbench.rundir.reader import RECORD_DOCS

    if not out.is_dir() or out.resolve() == run_dir.resolve():
        return
    held = next(((name, what) for name, what in RECORD_DOCS.items() if (out / name).is_file()), None)
    if held:
        fail(ConfigError("--out", f"{out} holds {held[1]} ({held[0]}), whose report.html this run's would replace",
                         "choose a new directory, or leave --out out to write into RUN_DIR"))


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Finished run directories (budgets, policies, engines).")],
    out: Annotated[Path | None, typer.Option(help="Report directory (default reports/<time>-compare); not one that "
                                            "holds a run, sweep, capacity search or comparison.")] = None,
    slo: Annotated[str | None, typer.Option(help="SLOs to judge the runs by, e.g. 'ttft:le2k=2s,itl_p99=150ms'.")] = None,
    force: Annotated[bool, typer.Option(help="Compare runs whose workload, seed or injection differ.")] = False,
    as_json: AsJson = False,
) -> None:
    """Compare finished runs: one row each, overlaid figures and a verdict per SLO."""
    import datetime as dt

    from itlbench.report.compare import write_compare_report
    from itlbench.report.compare_print import comparison_doc, print_comparison
    from itlbench.report.compare_runs import check_compare_out

    for d in run_dirs:
        _require_run(d, "DIR")
    seen: dict[Path, Path] = {}
    for d in run_dirs:  # two rows of one run would read as two settings that agree
        if (first := seen.setdefault(d.resolve(), d)) is not d:
            fail(ConfigError("DIR", f"the run {first} is given twice", "name each run once"))
    target = out or Path("reports") / (dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S") + "-compare")
    try:
        check_compare_out(target)  # never over a run's, a sweep's or another comparison's report
        command = shlex.join(["itlbench", "compare", *map(str, run_dirs), *(["--slo", slo] if slo else []),
                              *(["--force"] if force else [])])
        written, rows, verdict = write_compare_report(run_dirs, target, slo, force, command=command)
    except ItlbenchError as exc:
        fail(exc)
        return
    if as_json:
        print_json(comparison_doc(rows, verdict, written.html))
        return
    print_comparison(console, rows, verdict, written.html)
    print(written.html)
