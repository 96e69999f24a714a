"""The out-of-core summary (summarize_dir: chunks partitioned by request, pooled percentiles selected
exactly in two passes) equals the in-memory reference figure for figure, on the report fixtures and on
random runs with every shape the gaps can take (bundled chunks, kernel stamps shared by a read,
injected requests, streams crossing the warmup, chunks without a request row, client pauses)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from itlbench.analysis import partitions as parts_mod
from itlbench.analysis.goodput import parse_slo
from itlbench.analysis.stalls import StallParams
from itlbench.analysis.summary import _window_from, analyze_run, recall, summarize_dir
from itlbench.rundir.store import RunStore
from tests.support.reference_analysis import differences, reference_of_dir
from tests.support.report_runs import build_run

MS = 1_000_000
S = 1_000_000_000


def _ours(run: Path, count: int | None) -> dict[str, object]:
    meta = json.loads((run / "run.json").read_text())
    summary, _ = summarize_dir(run, _window_from(meta), parse_slo(meta.get("slo")), StallParams.from_meta(meta),
                               partitions=count)
    return summary


def random_run(path: Path, seed: int, streams: int = 12) -> Path:
    """A run directory of random streams, written through the run store in 2 s parts."""
    rng = np.random.default_rng(seed)
    store = RunStore(path, flush_every_s=1e9)
    chunks: list[dict[str, object]] = []
    for i in range(streams):
        injected = i == 0
        rid = f"r{i:03d}"
        n = int(rng.integers(2, 400))
        t0 = int(rng.integers(0, 3 * S))  # some streams begin in the warmup
        gaps = rng.exponential(20 * MS, n).astype(np.int64)
        gaps[rng.random(n) < 0.02] += int(0.5 * S)  # stalls
        gaps[rng.random(n) < 0.05] = 0  # chunks read together share a stamp
        t = t0 + np.cumsum(gaps)
        kernel = i % 3 != 0
        for k in range(n):
            shared = k + 1 < n and t[k + 1] == t[k]
            chunks.append({"request_id": rid, "index": k, "t_ns": int(t[k]), "n_tokens": int(rng.choice([1, 1, 1, 3])),
                           "stamp": "kernel" if kernel else "user", "t_read_ns": int(t[k]) + int(rng.integers(0, MS)),
                           "read_chunks": 2 if shared else 1})
        if i == streams - 1:
            continue  # a stream whose request row was never written (a killed run)
        think = int(rng.integers(1, n + 1)) if i % 3 == 1 else 0  # reasoning chunks first; = n: never answered
        answer_ns = None if think == n else int(t[think])
        store.add("requests", {"request_id": rid, "server_request_id": f"srv-{i}", "workload": "chat",
                               "cls": "injected" if injected else "chat", "injected": injected,
                               "stream": None if injected else i, "prompt_tokens": int(rng.integers(10, 9000)),
                               "max_tokens": n, "scheduled_ns": t0 - 5 * MS, "sent_ns": t0 - 4 * MS,
                               "first_token_ns": int(t[0]), "last_token_ns": int(t[-1]), "done_ns": int(t[-1]) + MS,
                               "output_tokens": n, "num_chunks": n, "status": "ok" if i % 5 else "error",
                               "reasoning_chunks": think, "first_answer_ns": answer_ns,
                               "http_status": 200})
    order = rng.permutation(len(chunks))
    for batch in np.array_split(order, 7):  # parts hold interleaved pieces of every stream
        store.add_many("chunks", [chunks[j] for j in sorted(batch, key=lambda j: chunks[j]["t_ns"])])  # type: ignore[arg-type,return-value]
        store.flush()
    end = max(int(c["t_ns"]) for c in chunks) - int(rng.integers(0, S))  # type: ignore[call-overload]
    steps = [{"step": k, "phase": "prefill" if k % 9 == 0 else "decode", "prefill_tokens": 512 if k % 9 == 0 else 0,
              "decode_tokens": streams, "start_ns": k * 100 * MS, "end_ns": k * 100 * MS + 90 * MS,
              "prefill_request_ids": ["srv-0"] if k % 9 == 0 else [], "num_preemptions": int(k % 50 == 7)}
             for k in range(end // (100 * MS))]
    store.add_many("steps", steps)
    store.add_many("client_pauses", [{"start_ns": 2 * S, "end_ns": 2 * S + 300 * MS, "kind": "gc", "cpu_s": 0.3,
                                      "runq_s": 0.0}])
    store.add_many("client_samples", [{"t_ns": k * S, "loop_lag_s": 0.0005, "cpu_percent": 10.0, "in_flight": streams,
                                       "clock_offset_ns": 0} for k in range(20)])
    store.close()
    (path / "run.json").write_text(json.dumps({"run_start_ns": 0, "measure_start_ns": 1 * S, "end_ns": end,
                                               "stall_factor": 5.0, "stall_floor_s": 0.05, "slo": "itl_p99=60ms"}))
    return path


@pytest.mark.parametrize("variant", [{}, {"inject": False}, {"external": True}, {"streams": 9, "stall_scale": 1.7}])
def test_every_figure_equals_the_reference_on_the_report_fixtures(tmp_path: Path, variant: dict) -> None:
    run = build_run(tmp_path / "run", **variant)
    ref = reference_of_dir(run)
    for count in (None, 3):
        assert differences(_ours(run, count), ref) == [], f"{count} partitions"


@pytest.mark.parametrize("seed", range(4))
def test_every_figure_equals_the_reference_on_random_runs(tmp_path: Path, seed: int) -> None:
    run = random_run(tmp_path / "run", seed)
    ref = reference_of_dir(run)
    assert ref["itl_s"]["count"] > 0 and ref["stalls"]["count"] > 0  # type: ignore[index]
    assert ref["validity"]["figures"]["kernel_stamped_share"] > 0  # type: ignore[index]
    assert ref["reasoning"]["itl_reasoning_s"]["count"] > 0  # type: ignore[index]
    for count in (1, 2, 5):
        assert differences(_ours(run, count), ref) == [], f"{count} partitions"


def test_partitions_hold_whole_requests_and_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = random_run(tmp_path / "run", 7)
    total = parts_mod.chunk_rows(run)
    for streaming in (True, False):
        with parts_mod.partitions(run, 4, streaming=streaming) as pieces:
            frames = [p.read() for p in pieces]
        assert sum(f.height for f in frames) == total
        owners = [set(f["request_id"].unique().to_list()) for f in frames]
        assert sum(len(o) for o in owners) == len(set().union(*owners)), "a request split across partitions"
    monkeypatch.setattr(parts_mod, "ROWS_PER_PARTITION", total // 3)
    assert parts_mod.partition_count(total, parts_mod.ROWS_PER_PARTITION) == 4


def test_the_manual_split_gives_the_same_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = random_run(tmp_path / "run", 3)
    ref = reference_of_dir(run)
    monkeypatch.setattr(parts_mod, "_split_streaming", parts_mod._split_by_part)
    assert differences(_ours(run, 3), ref) == []


def test_analyze_run_partitions_a_large_run_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = random_run(tmp_path / "run", 5)
    monkeypatch.setattr(parts_mod, "ROWS_PER_PARTITION", 300)
    assert differences(analyze_run(run), reference_of_dir(run)) == []
    kept = recall(run)
    assert kept is not None and kept[1].chunks.partitions == -(-parts_mod.chunk_rows(run) // 300) > 1


def test_a_chunk_part_not_typed_as_itlbench_writes_it_is_split_part_by_part(tmp_path: Path) -> None:
    """The streaming split casts strictly: text in t_ns (a number written out) was a polars SchemaError traceback
    out of analyze on a run large enough to partition, where every other reader coerces it (`conform`)."""
    import polars as pl

    run = random_run(tmp_path / "run", 11)
    ref = reference_of_dir(run)
    for part in sorted((run / "chunks").rglob("*.parquet")):
        pl.read_parquet(part).with_columns(pl.col("t_ns").cast(pl.Utf8)).write_parquet(part)
    assert differences(_ours(run, 3), ref) == []

