"""Compacting a finished run's parts keeps every row in order, and a crash at any point of it leaves a
run that the next compaction repairs to exactly the rows it had."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from itlbench.analysis.summary import analyze_run
from itlbench.rundir import compact
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from tests.support.report_runs import build_run


def _many_parts(path: Path, parts: int = 40) -> Path:
    store = RunStore(path, flush_every_s=1e9)
    for k in range(parts):
        store.add_many("chunks", [{"request_id": f"r{i}", "index": k, "t_ns": k * 1000 + i, "n_tokens": 1}
                                  for i in range(25)])
        store.add("requests", {"request_id": f"q{k}", "status": "ok"})
        store.flush()
    store.close()
    (path / "run.json").write_text("{}")
    return path


def test_compaction_keeps_every_row_in_order_in_few_files(tmp_path: Path) -> None:
    run = _many_parts(tmp_path / "run")
    before = {t: read_table(run, t) for t in ("chunks", "requests")}
    done = {c.table: c for c in compact.compact_run(run, target_rows=300)}
    assert done["chunks"].parts_before == 40 and done["chunks"].parts_after == 4  # 1,000 rows, 300 a file
    assert done["requests"].parts_after == 1 and done["chunks"].rows == 1000
    for table, frame in before.items():
        assert_frame_equal(read_table(run, table), frame)
    assert not list((run / "chunks").glob(".*")), "nothing left aside"
    again = {c.table: c for c in compact.compact_run(run, target_rows=300)}
    assert again["chunks"].parts_after == 4, "compacting a compacted run changes nothing"


@pytest.mark.parametrize("when", ["before_rename", "after_rename"])
def test_a_crash_mid_compaction_is_repaired_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        when: str) -> None:
    run = _many_parts(tmp_path / "run")
    before = read_table(run, "chunks")
    real = compact.os.replace

    def crash(src: str, dst: str) -> None:
        if when == "after_rename":
            real(src, dst)
        raise RuntimeError("power cut")

    monkeypatch.setattr(compact.os, "replace", crash)
    with pytest.raises(RuntimeError):
        compact.compact_table(run, "chunks", target_rows=300)
    assert (run / "chunks" / compact.JOURNAL).is_file()
    if when == "after_rename":
        assert read_table(run, "chunks").height > before.height, "until repaired, rows are seen twice"
    else:
        assert_frame_equal(read_table(run, "chunks"), before)  # the aside file is not a part
    monkeypatch.setattr(compact.os, "replace", real)
    compact.compact_table(run, "chunks", target_rows=300)
    assert_frame_equal(read_table(run, "chunks"), before)
    assert not (run / "chunks" / compact.JOURNAL).exists()


def test_a_compacted_run_analyses_to_the_same_summary(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run")
    chunks = read_table(run, "chunks")  # split into many small parts, as a long run's 2 s flushes would
    for p in (run / "chunks").glob("*.parquet"):
        p.unlink()
    for i, piece in enumerate(chunks.iter_slices(37)):
        piece.write_parquet(run / "chunks" / f"part-{i:05d}.parquet")
    first = analyze_run(run)
    compact.compact_run(run)
    assert len(list((run / "chunks").glob("*.parquet"))) == 1
    assert analyze_run(run) == first
    assert pl.read_parquet(next((run / "chunks").glob("*.parquet"))).height == chunks.height


def test_compacting_a_directory_that_is_not_a_run_names_it(tmp_path: Path) -> None:
    from itlbench.errors import ConfigError

    with pytest.raises(ConfigError, match="RUN_DIR"):
        compact.compact_run(tmp_path)


def _cut_in_half(part: Path) -> None:
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])


def test_a_part_cut_short_on_disk_is_left_out_and_named_not_fatal(tmp_path: Path) -> None:
    """One damaged part (no footer) must not cost the run its other records: every reader leaves it out,
    the summary names it, the terminal and report say so, and compaction leaves it where it is."""
    from typer.testing import CliRunner

    from itlbench.cli import app

    run = build_run(tmp_path / "run")
    chunks = read_table(run, "chunks")
    for p in (run / "chunks").glob("*.parquet"):
        p.unlink()
    for i, piece in enumerate(chunks.iter_slices(chunks.height // 3 + 1)):
        piece.write_parquet(run / "chunks" / f"part-{i:05d}.parquet")
    _cut_in_half(run / "chunks" / "part-00001.parquet")
    kept = read_table(run, "chunks")
    assert 0 < kept.height < chunks.height
    summary = analyze_run(run)
    assert summary["unreadable_parts"] == ["chunks/part-00001.parquet"]
    assert summary["itl_s"]["count"] > 0
    result = CliRunner().invoke(app, ["analyze", str(run)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "1 record file could not be read (cut short on disk) and is left out of every figure: " \
           "chunks/part-00001.parquet" in " ".join(result.output.split())
    assert "left out of every figure" in (run / "report.md").read_text()
    done = {c.table: c for c in compact.compact_run(run)}
    assert (run / "chunks" / "part-00001.parquet").is_file() and done["chunks"].rows == kept.height
    assert_frame_equal(read_table(run, "chunks"), kept)
