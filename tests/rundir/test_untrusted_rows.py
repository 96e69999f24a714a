"""Rows from untrusted peers never lose a run: wrong types are coerced or nulled where they are read
and where they are written, and a part that parquet still refuses is quarantined, never dropped."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from itlbench.errors import ItlbenchError
from itlbench.load.locust.job import rows_from_columns
from itlbench.load.observers.steps_follower import StepsFollower
from itlbench.rundir.coerce import as_count, as_str
from itlbench.rundir.reader import read_table
from itlbench.rundir.schema import TABLES, coerce_row
from itlbench.rundir.store import QUARANTINE_DOC, RunStore


def test_strings_are_str_and_counts_non_negative_int64_or_null():
    assert [as_str(v) for v in ("a", 123, 1.5, True, None, {"x": 1}, [1], float("nan"))] == [
        "a", "123", "1.5", None, None, None, None, None]
    assert [as_count(v) for v in (3, 3.0, -1, 2**63, 2**63 - 1, "7", True, 1e30, 2.5, None)] == [
        3, 3, None, None, 2**63 - 1, None, None, None, None, None]


def test_a_wrongly_typed_cell_is_coerced_at_flush_not_the_whole_buffer_lost(tmp_path: Path):
    store = RunStore(tmp_path)
    store.add("requests", {"request_id": "r0", "server_request_id": 123, "status": "ok", "output_tokens": 5})
    store.add("requests", {"request_id": "r1", "server_request_id": {"nested": 1}, "status": "ok",
                           "output_tokens_reported": 2**70, "prompt_tokens_reported": "7", "finish_reason": 7})
    store.add("requests", {"request_id": "r2", "server_request_id": "fine", "status": "ok"})
    store.close()
    req = read_table(tmp_path, "requests").sort("request_id")
    assert req["request_id"].to_list() == ["r0", "r1", "r2"]
    assert req["server_request_id"].to_list() == ["123", None, "fine"]
    assert req["output_tokens_reported"].to_list() == [None, None, None] and req["finish_reason"][1] == "7"
    assert store.coerced["requests"] == 5 and not store.quarantined


def test_a_part_parquet_refuses_is_quarantined_as_json_lines_and_counted(tmp_path: Path):
    store = RunStore(tmp_path)
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / ".part-00000.parquet.tmp").mkdir()  # the write of part 0 fails
    store.add("requests", {"request_id": "r0", "status": "ok", "output_tokens": 5})
    store.add("requests", {"request_id": "r1", "status": "error", "error": "x" * 10})
    store.flush()
    store.add("requests", {"request_id": "r2", "status": "ok"})
    store.close()
    lines = (tmp_path / "requests" / "quarantine-00000.jsonl").read_text().splitlines()
    assert [json.loads(x)["request_id"] for x in lines] == ["r0", "r1"]
    assert read_table(tmp_path, "requests")["request_id"].to_list() == ["r2"]  # later parts still parquet
    doc = json.loads((tmp_path / QUARANTINE_DOC).read_text())
    assert doc["requests"]["rows"] == 2 == store.quarantined["requests"]
    assert doc["requests"]["files"] == ["requests/quarantine-00000.jsonl"] and "Error" in doc["requests"]["errors"][0]


def test_a_frame_of_the_wrong_schema_is_quarantined_with_the_rows_beside_it(tmp_path: Path):
    store = RunStore(tmp_path)
    store.add("chunks", {"request_id": "a", "index": 0, "t_ns": 1, "n_tokens": 1})
    store.add_frame("chunks", pl.DataFrame({"request_id": ["b"], "surprise": [1.5]}))
    store.close()
    rows = [json.loads(x) for x in (tmp_path / "chunks" / "quarantine-00000.jsonl").read_text().splitlines()]
    assert [r["request_id"] for r in rows] == ["a", "b"] and store.quarantined == {"chunks": 2}


def test_rows_the_disk_refuses_even_as_json_stay_buffered_and_close_says_so(tmp_path: Path):
    store = RunStore(tmp_path)
    (tmp_path / "steps").write_text("a file where the table's folder goes")
    store.add("steps", {"step": 0})
    store.flush()
    assert store.unwritten() == {"steps": 1}
    with pytest.raises(ItlbenchError, match=r"could not write 1 steps rows to .* \(see the log\)"):
        store.close()
    (tmp_path / "steps").unlink()
    store.close()  # the disk came back: the row is written after all
    assert read_table(tmp_path, "steps")["step"].to_list() == [0]


def test_steps_lines_from_a_hostile_server_are_coerced_or_skipped(tmp_path: Path):
    store = RunStore(tmp_path)
    f = StepsFollower("http://127.0.0.1:9/v1", store)
    for line in (b'{"step": 0, "phase": 5, "prefill_tokens": -4, "start_ns": -7, "prefill_request_ids": [1, "a"]}',
                 b'[1, 2]', b'{"step": "x"}', b'not json', b'{"step": 1.0, "kv_usage": "high", "num_running": 3}'):
        f._on_line(line)
    store.close()
    steps = read_table(tmp_path, "steps").sort("step")
    assert steps["step"].to_list() == [0, 1] and f.bad_lines == 3 and f.next_step == 2
    assert steps["phase"].to_list() == ["5", None] and steps["prefill_tokens"].to_list() == [None, None]
    assert steps["start_ns"].to_list() == [-7, None] and steps["prefill_request_ids"][0].to_list() == ["1", "a"]
    assert steps["kv_usage"].to_list() == [None, None] and steps["num_running"].to_list() == [None, 3]


def test_locust_worker_batches_are_coerced_and_malformed_ones_refused():
    rows = rows_from_columns("requests", {"request_id": ["a", 5], "num_chunks": [-1, 3], "sent_ns": [10, "x"],
                                          "bogus": [1, 2]})
    assert rows is not None and [r["request_id"] for r in rows] == ["a", "5"]
    assert [r["num_chunks"] for r in rows] == [None, 3] and [r["sent_ns"] for r in rows] == [10, None]
    assert set(rows[0]) == set(TABLES["requests"])
    for table, cols in (("requests", {"request_id": ["a"], "num_chunks": []}), ("nope", {"a": [1]}),
                        ("requests", ["a"]), ("requests", {"request_id": "abc"}), (None, {})):
        assert rows_from_columns(table, cols) is None
    assert coerce_row("requests", "not a row") is None


def test_worker_parts_of_an_unmerged_run_are_read_once(tmp_path: Path):
    """A run killed before `merge_worker_parts`: workers/<k>/ parts are read, but not those of a
    worker whose merged part already exists (killed mid-merge)."""
    from itlbench.load.multiproc import MERGED_PART_BASE
    from itlbench.rundir.reader import WORKER_PART_BASE

    assert WORKER_PART_BASE == MERGED_PART_BASE
    for k in (0, 1):
        s = RunStore(tmp_path / "workers" / str(k))
        s.add("requests", {"request_id": f"w{k}"})
        s.close()
    assert sorted(read_table(tmp_path, "requests")["request_id"]) == ["w0", "w1"]
    merged = RunStore(tmp_path)
    merged.add("requests", {"request_id": "w0"})
    merged.close()
    (tmp_path / "requests" / "part-00000.parquet").rename(tmp_path / "requests" / "part-90000.parquet")
    assert sorted(read_table(tmp_path, "requests")["request_id"]) == ["w0", "w1"]


def test_no_provisional_refresh_lands_after_the_final_run_document(tmp_path: Path):
    store = RunStore(tmp_path, flush_every_s=0.01)
    store.keep_doc_current("run.json", {"a": 1}, run_start_ns=0, measure_start_ns=10, planned_end_ns=20)
    assert json.loads((tmp_path / "run.json").read_text())["provisional"] is True
    refresh = store._on_flush
    store.close()
    store.write_json("run.json", {"final": True})
    refresh()  # a refresh that was already under way when the run ended
    assert json.loads((tmp_path / "run.json").read_text()) == {"final": True}
