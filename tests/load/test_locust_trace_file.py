"""The trace a Locust launcher hands its local workers: written as plain arrays, read back the same (Mooncake's
prefix blocks included), and never a failed run where it cannot be written or read (the worker reads the trace
file itself). The handing-over in a real run: tests/harness/test_trace_read_once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from itlbench.load.locust.trace_file import TRACE_FILE_ENV, read_trace, trace_from_env, write_trace
from itlbench.workloads.trace import Trace, load_trace


def _same(a: Trace, b: Trace) -> None:
    assert (a.path, a.format, a.invalid_rows, a.blocks) == (b.path, b.format, b.invalid_rows, b.blocks)
    for name in ("offsets_s", "prompt_tokens", "output_tokens"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def test_an_azure_trace_with_skipped_rows_reads_back_the_same(tmp_path: Path) -> None:
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.680590,374,44\n"
                   "2023-11-16 18:15:50.995169,0,109\n2023-11-16 18:15:51.5,396,109\n")
    trace = load_trace(csv)
    assert trace.invalid_rows == 1 and trace.blocks is None
    assert write_trace(trace, tmp_path / "t.npz")
    _same(read_trace(tmp_path / "t.npz"), trace)


def test_mooncake_prefix_blocks_read_back_row_by_row(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 1200, "output_length": 12, "hash_ids": [10, 11, 12]},
            {"timestamp": 1500, "input_length": 300, "output_length": 40, "hash_ids": []},
            {"timestamp": 2750, "input_length": 1100, "output_length": 8, "hash_ids": [10, 11, 2**62]}]
    jsonl = tmp_path / "moon.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = load_trace(jsonl)
    assert write_trace(trace, tmp_path / "t.npz")
    back = read_trace(tmp_path / "t.npz")
    _same(back, trace)
    assert back.blocks == ((10, 11, 12), (), (10, 11, 2**62)) and back.format == "mooncake"


def test_block_ids_past_int64_are_not_handed_over_and_leave_no_file(tmp_path: Path) -> None:
    trace = Trace("x.jsonl", np.zeros(1), np.ones(1, np.int64), np.ones(1, np.int64), ((2**64,),), "mooncake")
    assert not write_trace(trace, tmp_path / "t.npz")
    assert not (tmp_path / "t.npz").exists()


def test_a_worker_reads_the_handed_trace_only_where_the_launcher_named_one_it_can_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_FILE_ENV, raising=False)
    assert trace_from_env() is None  # a worker started by hand: reads its own trace file
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    monkeypatch.setenv(TRACE_FILE_ENV, str(tmp_path / "bad.npz"))
    assert trace_from_env() is None
    monkeypatch.setenv(TRACE_FILE_ENV, str(tmp_path / "gone.npz"))
    assert trace_from_env() is None
    trace = Trace("a.csv", np.array([0.0, 0.5]), np.array([3, 4]), np.array([5, 6]))
    write_trace(trace, tmp_path / "t.npz")
    monkeypatch.setenv(TRACE_FILE_ENV, str(tmp_path / "t.npz"))
    got = trace_from_env()
    assert got is not None
    _same(got, trace)
