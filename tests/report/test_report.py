"""Reports from hand-built run directories: every kind of run renders, and says what happened."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from itlbench.analysis.goodput import parse_slo
from itlbench.cli import app
from itlbench.report.compare import make_rows, verdict
from itlbench.report.compare_runs import differing_settings, load_runs
from itlbench.report.data import load_run
from itlbench.report.run_report import headline, write_run_report
from itlbench.report.timeline import _segments, injected_spans, stall_picture
from itlbench.units import parse_duration_s
from tests.support.report_runs import PAUSE, build_run

runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _check_written(run_dir: Path) -> tuple[str, str]:
    """Every figure a non-empty PNG, linked from the Markdown and embedded in the HTML; no network."""
    html = (run_dir / "report.html").read_text()
    md = (run_dir / "report.md").read_text()
    figures = sorted((run_dir / "figures").glob("*.png"))
    assert figures, "a report without figures"
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(embedded) == len(figures)
    for fig in figures:
        data = fig.read_bytes()
        assert data.startswith(PNG) and len(data) > 5_000, f"{fig.name} is empty"
        assert f"](figures/{fig.name})" in md
    assert {base64.b64decode(e) for e in embedded} == {f.read_bytes() for f in figures}
    assert not re.search(r'(src|href)="https?:', html), "the HTML must not load anything from the network"
    assert "<script" not in html
    return _flat(html), md


def test_injected_run_shows_the_stall_its_cause_and_the_prefill(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    write_run_report(run)
    html, md = _check_written(run)
    assert {p.stem for p in (run / "figures").glob("*.png")} == {
        "stalls", "engine_steps", "ttft", "itl_cdf", "throughput", "split", "goodput"}
    assert "While inj-000 (8k tokens) was prefilled in 4 engine steps over 1.50 s, all 4 steady streams froze" in html
    assert "the worst 1.52 s. Its own first token came after 1.51 s." in html
    assert "Valid run" in html and "cut short" not in html
    # a 10 s run has too few requests for a send-lag p99: the banner gives the largest instead of a dash
    assert re.search(r"send lag at most [\d.]+ (ms|s|µs) over \d+ requests, too few for a p99", html), html[:2000]
    assert "itlbench run --workload chat --inject 8k@4s --streams 4 --duration 10" in html
    assert "TTFT: " not in md  # definitions are given by name, one sentence each
    assert "**TTFT**: first generated token's arrival at the client − the request's scheduled send time." in md


def test_stall_picture_data_locates_the_freeze(tmp_path: Path) -> None:
    data = load_run(build_run(tmp_path / "run"))
    [span] = injected_spans(data)
    assert (span.start_s, span.end_s, span.steps) == (4.0, 5.5, 4), "the span comes from the engine's steps"
    stalled = _segments(data).filter(pl.col("cause") != "streaming")
    assert stalled.height == 4 and set(stalled["cause"]) == {"prefill"}
    for lo, hi in stalled.select("lo_ns", "hi_ns").iter_rows():
        assert lo <= PAUSE[0] and hi >= PAUSE[1], "each stream's stall covers the whole prefill"


def test_zero_stall_run_says_so(tmp_path: Path) -> None:
    run = build_run(tmp_path / "calm", inject=False)
    write_run_report(run)
    html, _ = _check_written(run)
    assert load_run(run).stalls.is_empty()
    assert ("No stream stalled (a stall: a gap of at least 5x the median gap of its stream and at least 50 ms) and no "
            "prompt was injected.") in html


def test_injected_prompt_without_a_stall_states_the_rule_beside_the_p99(tmp_path: Path) -> None:
    """A reader sees ITL p99 at 4x the median and 'without stalling': the headline says why that is no stall."""
    run = build_run(tmp_path / "brief", stall_scale=0.03)  # a 45 ms pause in 20 ms gaps: under 5x the median
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(doc | {"stall_factor": 2.5}))  # 50 ms: now a stall
    assert "froze" in headline(load_run(run))
    (run / "run.json").write_text(json.dumps(doc))
    line = headline(load_run(run))
    assert ("without stalling any steady stream (a stall: a gap of at least 5x the median gap of its stream and at least "
            "50 ms).") in line


def test_run_killed_before_writing_its_window_is_reported_cut_short(tmp_path: Path) -> None:
    run = build_run(tmp_path / "killed", window=False)
    result = runner.invoke(app, ["report", str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    html, md = _check_written(run)
    assert "This run was cut short: the run was killed before it wrote its end time" in html
    assert "cut short" in md


def test_run_stopped_early_is_reported_cut_short(tmp_path: Path) -> None:
    run = build_run(tmp_path / "short", duration_s=60.0)
    write_run_report(run)
    html, _ = _check_written(run)
    assert "This run was cut short: it measured 10.0 s of the planned 60 s" in html


def test_external_engine_run_names_the_engine_and_the_source(tmp_path: Path) -> None:
    run = build_run(tmp_path / "vllm", external=True)
    data = load_run(run)
    assert data.engine.name == "vLLM" and data.engine.external
    assert data.engine.source.startswith("server counters")
    write_run_report(run)
    html, _ = _check_written(run)
    assert "External engine: vLLM (identified by /metrics series prefix vllm:)" in html
    assert "vLLM's own counters" in html or "engine_steps" in {p.stem for p in (run / "figures").glob("*.png")}
    assert "while inj-000" in html.lower() and "(client view)" in html


def test_an_external_run_without_stamps_to_infer_steps_from_draws_the_engines_token_counters(tmp_path: Path) -> None:
    """No step log and no chunk stamps (every reply came whole, or none came): the engine's own /metrics counters
    are what is left; their rates between scrapes show the injected prefill (5,000 prompt tokens/s while it ran)."""
    from itlbench.report.steps_figure import engine_steps_figure

    run = build_run(tmp_path / "vllm", external=True)
    for part in (run / "chunks").glob("*.parquet"):
        part.unlink()
    spec = engine_steps_figure(load_run(run))
    assert spec.figure is not None and spec.note is None
    ax = spec.figure.axes[0]
    assert "vLLM's own counters between /metrics scrapes" in ax.get_title(loc="left")
    rates = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
    t, prompt = rates["prompt (prefill) tokens/s"]
    assert t == [float(k) for k in range(11)], "one rate per scrape interval, on the measurement's clock"
    assert prompt == [0.0] * 5 + [5000.0, 2500.0] + [0.0] * 4, "1.5 s of prefill at 5,000 tokens/s; each rate is drawn up to the scrape that ends it"
    assert rates["generated (decode) tokens/s"][1] == [200.0] * 11
    write_run_report(run)
    html, _ = _check_written(run)
    assert "this shows the rate of its own token counters between scrapes" in html


def test_report_cli_rejects_a_directory_without_run_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)], terminal_width=300)
    assert result.exit_code == 2
    assert "error: RUN_DIR" in _flat(result.output) and "Traceback" not in result.output


def test_reproduce_command_parses_back_to_the_run_settings(tmp_path: Path) -> None:
    import typer.main

    from itlbench.report.reproduce import reproduce_command

    data = load_run(build_run(tmp_path / "run"))
    args = reproduce_command(data.doc).split()[2:]
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    params = command.make_context("run", args).params
    cfg = data.config
    assert params["workload"] == cfg["workload"] and ";".join(params["inject"]) == cfg["inject"]  # a repeatable flag
    assert params["streams"] == cfg["streams"]
    assert parse_duration_s(params["duration"], "--duration") == cfg["duration_s"]
    assert params["seed"] == cfg["seed"] and params["chunk_budget"] == "2048" and params["model"] == "cpu-small"


def test_reproduce_command_restarts_the_simulated_engine_it_measured(tmp_path: Path) -> None:
    """A simulated run's line names the simulator, its GPU, TP, dtype and every other changed engine
    setting (it once dropped them, and the line started the CPU engine with an 8B model)."""
    import dataclasses

    import typer.main

    from itlbench.core.engine_config import EngineConfig
    from itlbench.report.reproduce import reproduce_command

    doc = load_run(build_run(tmp_path / "run")).doc
    eng = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="a100", tp=2, dtype="fp8", cuda_graphs=False,
                       policy="prefill-first", mixed=True, chunk_budget=None, kv_link_gbps=400.0)
    doc["config"] = {**doc["config"], "clock": "real", "engine": dataclasses.asdict(eng)}
    line = reproduce_command(doc)
    args = line.split()[2:]
    params = typer.main.get_command(app).commands["run"].make_context("run", args).params  # type: ignore[attr-defined]
    assert (params["engine"], params["gpu"], params["tp"], params["dtype"]) == ("sim", "a100", 2, "fp8")
    assert params["cuda_graphs"] is False and params["mixed"] is True and params["policy"] == "prefill-first"
    assert params["chunk_budget"] == "none" and params["clock"] == "real" and params["model"] == "llama-3.1-8b"
    assert "--kv-link-gbps" not in line and "--prefix-caching" not in line  # defaults stay out


def test_compare_refuses_runs_of_different_workloads_naming_the_settings(tmp_path: Path) -> None:
    a = build_run(tmp_path / "a")
    b = build_run(tmp_path / "b", seed=7, inject=False)
    result = runner.invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "cmp")], terminal_width=400)
    assert result.exit_code == 2, result.output
    out = _flat(result.output)
    assert "error: DIR: the runs differ in seed (a: 0, b: 7); inject (a: 8k@4s, b: none)" in out
    assert "--force" in out and "Traceback" not in out
    assert not (tmp_path / "cmp").exists()
    forced = runner.invoke(app, ["compare", str(a), str(b), "--force", "--out", str(tmp_path / "cmp")],
                           terminal_width=200)
    assert forced.exit_code == 0, forced.output
    assert "Compared with --force although the runs differ in seed" in _flat((tmp_path / "cmp/report.html").read_text())


def test_compare_ranks_the_shorter_stall_smoother_and_judges_slos(tmp_path: Path) -> None:
    long_ = build_run(tmp_path / "long")
    short = build_run(tmp_path / "short", stall_scale=0.1)
    runs = load_runs([long_, short])
    assert differing_settings(runs) == []
    rows = make_rows(runs)
    assert rows[1].worst_s < 0.2 < 1.4 < rows[0].worst_s
    lines = verdict(rows, parse_slo("itl_max=500ms,injected/ttft=off"))
    assert lines[0].startswith("Meets every SLO (--slo itl_max=500ms,injected/ttft=off over the default targets; on the run's pooled figures; "
                               "goodput counts requests one by one): ")
    assert "(short)" in lines[0] and "(long)" not in lines[0], "same setting twice: labelled by directory"
    assert any(line.startswith("budget 2048 (long) misses: ITL max 1.52 s > 500 ms") for line in lines)
    assert any(line.startswith("Smoothest streams: budget 2048 (short)") for line in lines)
    assert not any(line.startswith("Yet a steady stream") for line in lines)  # itl_max judges the worst gap itself
    # under a p99 target both pass, yet the long run froze a stream 1.52 s: the verdict says so, and for it alone
    p99 = verdict(rows, parse_slo("itl_p99=500ms,injected/ttft=off"))
    hidden = [line for line in p99 if line.startswith("Yet a steady stream")]
    assert p99[0].count("budget 2048") == 2 and len(hidden) == 1
    assert hidden[0].startswith("Yet a steady stream waited longer than the 500 ms ITL target in budget 2048 (long) "
                                "(worst gap 1.52 s, ITL p99 ") and "(short)" not in hidden[0]
    assert hidden[0].endswith("so --slo itl_max=DUR judges the worst one.")
    told = runner.invoke(app, ["compare", str(long_), str(short), "--out", str(tmp_path / "p99"), "--slo",
                               "itl_p99=500ms"], terminal_width=200)
    assert told.exit_code == 0, told.output
    html = _flat((tmp_path / "p99" / "report.html").read_text())  # the headline answers, the verdict says the rest
    assert html.index("Pick budget 2048 (short): the smoothest setting, and it meets every SLO") < html.index(
        "Verdict") < html.index("Meets every SLO") < html.index("Yet a steady stream") < html.index("Smoothest")
    assert html.count("Yet a steady stream") == 1, "the callout no longer repeats the verdict"
    result = runner.invoke(app, ["compare", str(long_), str(short), "--out", str(tmp_path / "cmp"),
                                 "--slo", "itl_max=500ms"], terminal_width=200)
    assert result.exit_code == 0, result.output
    html, md = _check_written(tmp_path / "cmp")
    assert {p.stem for p in (tmp_path / "cmp/figures").glob("*.png")} == {
        "compare_stalls", "compare_gaps", "compare_itl_cdf", "compare_tradeoff"}
    assert "engine step log" in html and "itlbench bundled (cpu-small)" in html


def test_compare_labels_an_external_engine_row_and_its_source(tmp_path: Path) -> None:
    runs = load_runs([build_run(tmp_path / "ours"), build_run(tmp_path / "theirs", external=True)], force=True)
    rows = make_rows(runs)
    assert [r.label for r in rows] == ["budget 2048, cpu-small on torch", "vLLM, m"]  # engines and models differ
    assert rows[1].run.engine.source.startswith("server counters (vllm:* from /metrics)")
    assert rows[0].run.engine.source == "engine step log"


def test_a_run_whose_tokens_mostly_arrive_together_draws_its_stall_picture(tmp_path: Path) -> None:
    """Two tokens a read (a server that writes events in pairs): the median gap is 0, which a log axis has
    no place for; the picture says so instead of collapsing its layout (matplotlib's warning, an error here)."""
    import warnings

    run = build_run(tmp_path / "pairs")
    files = sorted((run / "chunks").glob("*.parquet"))
    chunks = pl.concat([pl.read_parquet(f) for f in files])
    paired = chunks.sort("request_id", "index").with_columns(
        pl.when(pl.col("index") % 2 == 1).then(pl.col("t_ns").shift(1).over("request_id"))
        .otherwise(pl.col("t_ns")).alias("t_ns"))
    for f in files:
        f.unlink()
    paired.write_parquet(run / "chunks" / "part-0.parquet")
    assert runner.invoke(app, ["analyze", str(run)]).exit_code == 0
    assert load_run(run).chunks.quantiles["itl_s"]["p50"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        write_run_report(run)
    _check_written(run)
    gaps = stall_picture(load_run(run)).axes[1]
    assert gaps.get_yscale() == "log" and any("median gap 0" in t.get_text() for t in gaps.texts)


def test_a_log_axis_of_seconds_labels_its_minor_ticks_as_durations_within_a_decade() -> None:
    from itlbench.report.style import new_figure, seconds_log_yaxis

    def labels(lo: float, hi: float) -> tuple[list[str], list[str]]:
        fig = new_figure(3.0)
        ax = fig.subplots()
        ax.plot([1, 2], [lo, hi])
        seconds_log_yaxis(ax)
        ax.set_ylim(lo, hi)
        fig.canvas.draw()
        return ([t.get_text() for t in ax.get_yticklabels() if t.get_text()],
                [t.get_text() for t in ax.get_yticklabels(minor=True) if t.get_text()])

    major, minor = labels(0.04, 0.11)  # under a decade: 50 ms … 90 ms between the decades' labels
    assert "100 ms" in major and {"50 ms", "90 ms"} <= set(minor), minor
    assert not any("10^" in t or "$" in t for t in major + minor)
    _, minor = labels(0.001, 10.0)  # four decades: the decades alone are labelled
    assert minor == []


def test_compare_refuses_one_run_given_twice(tmp_path: Path) -> None:
    run = build_run(tmp_path / "a")
    twice = runner.invoke(app, ["compare", str(run), str(tmp_path / "." / "a"), "--out", str(tmp_path / "c")],
                          terminal_width=300)
    assert twice.exit_code == 2 and f"error: DIR: the run {run} is given twice" in twice.output, twice.output
    assert not (tmp_path / "c").exists()


def test_compare_sets_apart_a_run_that_measured_nothing(tmp_path: Path) -> None:
    """A run aborted in its warm-up (every prompt refused) has no figures: it is neither valid nor judged
    against the SLOs (where an empty ITL once read as a miss); the verdict says it measured nothing."""
    sim = ["run", "--engine", "sim", "--model", "llama-3.1-8b", "--duration", "5s", "--no-live", "--no-report"]
    assert runner.invoke(app, [*sim, "--out", str(tmp_path / "ok")]).exit_code == 0
    assert runner.invoke(app, [*sim, "--kv-blocks", "1", "--out", str(tmp_path / "none")]).exit_code == 1
    rows = make_rows(load_runs([tmp_path / "ok", tmp_path / "none"]))
    assert [r.valid for r in rows] == [True, None]
    lines = verdict(rows, parse_slo(None))
    assert not any("(none) misses" in line for line in lines)
    assert any(line.startswith("Meets every SLO") and "(ok)" in line for line in lines)
    assert "Measured nothing (no request fell in its window; its report says why): budget 2048 (none)." in lines


def test_a_short_row_label_does_not_wrap_in_the_html(tmp_path: Path) -> None:
    """A label split over two lines reads as two rows; long cells in other columns may wrap."""
    from itlbench.report.document import CSS, Document, Section, Table, write_document

    table = Table(["", ""], [["requests (warm-up)", "x " * 200], ["a label far too long to keep on one line", "y"]])
    written = write_document(Document("t", "", [], [Section("s").add(table)]), tmp_path)
    html = written.html.read_text()
    assert "td.k{white-space:nowrap}" in CSS
    assert '<td class="k">requests (warm-up)</td>' in html
    assert '<td>a label far too long to keep on one line</td>' in html
    assert html.count('class="k"') == 1


def test_a_run_that_cannot_be_written_still_analyses_and_its_report_goes_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run shared read-only: `analyze --json` prints its figures (summary.json not saved, said on
    stderr), and `report` into a place it cannot write is one line naming --out, not a traceback."""
    import errno

    from itlbench.rundir.store import RunStore

    run = build_run(tmp_path / "run")

    def read_only(self: RunStore, name: str, obj: object, unless: object = None) -> Path:
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as m:
        m.setattr(RunStore, "write_json", read_only)
        result = runner.invoke(app, ["analyze", str(run), "--json"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["itl_s"]["count"] > 0
    assert "summary.json not saved (Read-only file system" in _flat(result.stderr)
    import itlbench.report.run_report as run_report

    def unwritable(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as m:
        m.setattr(run_report, "write_document", unwritable)
        result = runner.invoke(app, ["report", str(run)], terminal_width=200)
    assert result.exit_code == 2
    assert _flat(result.output) == (f"error: --out: cannot write the report into {run} (Read-only file system) "
                                    "(pass --out DIR to write it elsewhere)")


def test_a_sweep_directory_given_as_a_run_points_at_its_runs_and_its_report(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    build_run(sweep / "b512")
    build_run(sweep / "b2048", seed=1)
    (sweep / "sweep.json").write_text("{}")
    for command in (["analyze"], ["report"], ["compare"]):
        result = runner.invoke(app, [*command, str(sweep)], terminal_width=400)
        assert result.exit_code == 2, result.output
        assert f"{sweep} is a sweep, not a run (its runs are {sweep / 'b2048'}, {sweep / 'b512'}; its own report " \
               f"is {sweep / 'report.html'})" in _flat(result.output), result.output
