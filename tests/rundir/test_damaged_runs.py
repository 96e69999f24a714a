"""Run directories damaged the way copies and crashes damage them: refused in one line, never read as a
run of nothing whose summary replaces the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from itlbench.cli import app
from itlbench.errors import ConfigError
from itlbench.rundir.reader import not_a_run, read_table, require_records, unreadable_parts
from tests.support.report_runs import build_run

runner = CliRunner()


def _counted(run: Path) -> Path:
    doc = json.loads((run / "run.json").read_text())
    doc["compaction"] = {"requests": {"parts_before": 1, "parts_after": 1, "rows": 5}}
    (run / "run.json").write_text(json.dumps(doc))
    return run


def _cut_short(run: Path, table: str) -> list[Path]:
    parts = sorted((run / table).glob("*.parquet"))
    for part in parts:
        data = part.read_bytes()
        part.write_bytes(data[: len(data) // 2])  # no footer: a copy interrupted half-way
    return parts


def test_a_counted_table_whose_every_part_is_cut_short_is_refused(tmp_path: Path):
    run = _counted(build_run(tmp_path / "run"))
    parts = _cut_short(run, "requests")
    with pytest.raises(ConfigError) as info:
        require_records(run)
    text = str(info.value)
    assert "no readable part file" in text and "requests/ (5 rows" in text and parts[0].name in text
    assert "\n" not in text


def test_analyze_keeps_the_summary_of_a_run_whose_requests_no_longer_read(tmp_path: Path):
    """The summary the run wrote (5 requests) is the only whole record left: analyze must not replace it
    with a summary of none."""
    run = _counted(build_run(tmp_path / "run"))
    assert runner.invoke(app, ["analyze", str(run)]).exit_code == 0
    before = (run / "summary.json").read_bytes()
    assert json.loads(before)["requests"]["total"] == 5
    _cut_short(run, "requests")
    result = runner.invoke(app, ["analyze", str(run)], terminal_width=300)
    assert result.exit_code == 2, result.output
    assert "cut short" in result.output and "Traceback" not in result.output
    assert (run / "summary.json").read_bytes() == before


def test_a_table_with_one_readable_part_is_still_analysed(tmp_path: Path):
    """Documented: unreadable parts beside readable ones are left out and named, the run is not refused."""
    run = _counted(build_run(tmp_path / "run"))
    (run / "requests" / "part-99999.parquet").write_bytes(b"PAR1 cut")
    require_records(run)  # no error
    assert unreadable_parts(run) == ["requests/part-99999.parquet"]
    assert read_table(run, "requests").height == 5


def test_a_path_that_is_not_a_directory_is_named_as_such(tmp_path: Path):
    """Both said "has no run.json": a typo read as a run that lost its record, a run's own file as a directory."""
    run = build_run(tmp_path / "run")
    assert str(not_a_run(tmp_path / "runn")) == (f"RUN_DIR: {tmp_path / 'runn'} does not exist (pass a directory "
                                                 "written by `itlbench run`)")
    (tmp_path / "notes.txt").write_text("x")
    assert str(not_a_run(tmp_path / "notes.txt", "DIR")) == (f"DIR: {tmp_path / 'notes.txt'} is a file, not a run "
                                                             "directory (pass a directory written by `itlbench run`)")
    for command in ("report", "calibrate"):
        result = runner.invoke(app, [command, str(run / "run.json")], terminal_width=300)
        assert result.exit_code == 2
        assert result.output.strip() == (f"error: RUN_DIR: {run / 'run.json'} is a file, not a run directory (pass "
                                         f"the directory that holds it, {run})")


def test_a_part_not_typed_as_itlbench_writes_it_is_coerced_where_it_is_read(tmp_path: Path):
    """Text in a time column, a list for a status, a float no int64 holds: a strict cast was a polars traceback out
    of analyze, report and compare. As the writers do with a peer's rows, a cell that cannot be its column's type
    is null, and a cell that can (a number written as text) is kept."""
    import polars as pl

    run = build_run(tmp_path / "run")
    [part] = sorted((run / "requests").glob("*.parquet"))
    requests = pl.read_parquet(part)
    requests.with_columns(pl.col("scheduled_ns").cast(pl.Utf8), pl.lit([1, 2]).alias("status"),
                          pl.lit(1e300).alias("done_ns")).write_parquet(part)
    read = read_table(run, "requests")
    assert read["scheduled_ns"].to_list() == requests["scheduled_ns"].to_list()
    assert read["status"].null_count() == read["done_ns"].null_count() == requests.height


def test_a_killed_run_without_a_step_log_whose_chunks_hold_text_times_is_reported(tmp_path: Path):
    """report/data's window scan and report/inferred's step scan read the chunks with their own scans: text in t_ns
    was a polars SchemaError traceback (ComputeError where a filter compared it)."""
    import polars as pl

    run = build_run(tmp_path / "run", external=True, window=False)
    [part] = sorted((run / "chunks").glob("*.parquet"))
    pl.read_parquet(part).with_columns(pl.col("t_ns").cast(pl.Utf8)).write_parquet(part)
    from itlbench.report.data import load_run
    from itlbench.report.figure_spec import inferred_for

    data = load_run(run)  # the window, inferred from the chunks' span
    assert data.window_inferred and data.window.end_ns > data.window.run_start_ns
    view = inferred_for(data)  # the steps inferred from the chunks' stamps
    assert view is not None and view.steps.height > 0


def test_json_nested_deeper_than_the_parser_goes_is_a_document_that_does_not_read(tmp_path: Path):
    """Arrays in arrays 100,000 deep: json's decoder raised RecursionError, a traceback out of every command."""
    from itlbench.errors import ItlbenchError
    from itlbench.report.data import load_run
    from itlbench.rundir.reader import read_run_doc

    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    run = build_run(tmp_path / "run")
    (run / "summary.json").write_text(deep)
    require_records(run)  # summary.json's count does not read: nothing to hold the records to
    assert load_run(run).summary["requests"]["total"] == 5  # drawn from the records, as with no summary.json
    (run / "run.json").write_text(deep)
    with pytest.raises(ItlbenchError, match="run.json is not valid JSON \\(nested deeper than Python's parser goes"):
        read_run_doc(run)
    result = runner.invoke(app, ["analyze", str(run)], terminal_width=300)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
