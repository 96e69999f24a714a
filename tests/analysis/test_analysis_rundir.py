"""Reading a stored run: parquet part files per table, run.json window, nothing written."""

from __future__ import annotations

import json

import pytest

from itlbench.analysis import analyze_run
from itlbench.errors import ConfigError
from itlbench.rundir import load_tables
from itlbench.rundir.schema import TABLES, frame

MS = 1_000_000


def _write_run(root, meta):
    (root / "requests").mkdir()
    (root / "chunks").mkdir()
    reqs = [
        {
            "request_id": f"r{i}",
            "cls": "chat",
            "injected": False,
            "prompt_tokens": 100,
            "status": "ok",
            "scheduled_ns": (1000 + i) * MS,
            "sent_ns": (1000 + i) * MS,
            "first_token_ns": (1050 + i) * MS,
        }
        for i in range(2)
    ]
    frame("requests", reqs[:1]).write_parquet(root / "requests" / "part-0.parquet")
    frame("requests", reqs[1:]).drop("error").write_parquet(root / "requests" / "part-1.parquet")
    times = [1050, 1070, 1090, 1600, 1620, 1640]
    chunks = [{"request_id": "r0", "index": i, "t_ns": t * MS, "n_tokens": 1} for i, t in enumerate(times)]
    frame("chunks", chunks).write_parquet(root / "chunks" / "part-0.parquet")
    (root / "run.json").write_text(json.dumps(meta))


def test_load_tables_concatenates_parts_and_fills_missing(tmp_path):
    _write_run(tmp_path, {})
    tables = load_tables(tmp_path)
    assert set(tables) == set(TABLES)
    assert tables["requests"].height == 2
    assert tables["requests"].schema == frame("requests", []).schema  # a part lacking a column conforms
    assert tables["steps"].height == 0 and tables["steps"].schema == frame("steps", []).schema


def test_analyze_run_reads_window_and_params(tmp_path):
    meta = {
        "run_start_ns": 0,
        "measure_start_ns": 500 * MS,
        "end_ns": 2500 * MS,
        "slo": "itl_max=1s",
        "stall_factor": 10.0,
        "stall_floor_s": 0.2,
    }
    _write_run(tmp_path, meta)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    s = analyze_run(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    json.dumps(s, allow_nan=False)
    assert s["window"]["seconds"] == pytest.approx(2.0)
    assert s["stalls"]["params"] == {"factor": 10.0, "floor_s": 0.2}
    assert s["stalls"]["count"] == 1 and s["stalls"]["worst_s"] == pytest.approx(0.51)
    assert s["goodput"]["slos"]["default"]["itl_stat"] == "max"
    assert s["goodput"]["good"] == 2


def test_analyze_run_without_window_is_a_config_error(tmp_path):
    _write_run(tmp_path, {"run_start_ns": 0})
    with pytest.raises(ConfigError, match="end_ns"):
        analyze_run(tmp_path)
