"""`itl_s.max_not_client`: the worst gap the client's own pause did not make. A vLLM-CPU sweep ranked the setting
whose client paused least as smoothest (a 333 ms pause of the harness's event loop was another setting's worst
gap); a prefill that froze every stream is the server's and must still count.

Three streams pace 20 ms; a 500 ms prefill step freezes them (gaps of 520 ms, the server's), then the client's
loop stalls 790 ms while the engine keeps decoding (gaps of 820 ms, the client's)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from itlbench.analysis import RunWindow, analyze_run, summarize
from itlbench.rundir.schema import frame

MS = 1_000_000
WINDOW = RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=6000 * MS)
OFFSETS = {"a": 0, "b": 5, "c": 10}


def _times(offset: int) -> list[int]:
    """Every 20 ms, but none in the prefill (1500–2000 ms) nor in the client's pause (3000–3800 ms)."""
    return [t + offset for t in range(1000, 5000, 20) if not (1500 <= t < 2000 or 3000 <= t < 3800)]


def _req(rid: str, times: list[int], status: str = "ok", done: int | None = None) -> dict[str, object]:
    return {"request_id": rid, "server_request_id": rid, "workload": "chat", "cls": "chat", "injected": False,
            "prompt_tokens": 100, "max_tokens": 2000, "scheduled_ns": 990 * MS, "sent_ns": 990 * MS,
            "first_token_ns": times[0] * MS, "last_token_ns": times[-1] * MS,
            "done_ns": (times[-1] + 5 if done is None else done) * MS, "output_tokens": len(times),
            "num_chunks": len(times), "status": status}


def _tables(extra: dict[str, list[int]] | None = None, pauses: list[tuple[int, int]] = ((3000, 3790),),
            ) -> dict[str, pl.DataFrame]:
    """`extra`: streams still frozen when the window closed (cancelled after it)."""
    streams = {rid: _times(o) for rid, o in OFFSETS.items()}
    reqs = [_req(rid, ts) for rid, ts in streams.items()]
    reqs += [_req(rid, ts, "cancelled", 7000) for rid, ts in (extra or {}).items()]
    every = {**streams, **(extra or {})}
    steps = [{"step": i, "phase": "decode", "prefill_tokens": 0, "decode_tokens": 3, "start_ns": t * MS,
              "end_ns": (t + 10) * MS, "prefill_request_ids": []} for i, t in enumerate(range(990, 6000, 10))
             if not 1500 <= t < 2000]
    steps.append({"step": 10_000, "phase": "prefill", "prefill_tokens": 32768, "decode_tokens": 0,
                  "start_ns": 1500 * MS, "end_ns": 2000 * MS, "prefill_request_ids": ["other"]})
    return {"requests": frame("requests", reqs),
            "chunks": frame("chunks", [{"request_id": rid, "index": i, "t_ns": t * MS, "n_tokens": 1}
                                       for rid, ts in every.items() for i, t in enumerate(ts)]),
            "steps": frame("steps", steps),
            "client_pauses": frame("client_pauses", [{"start_ns": a * MS, "end_ns": b * MS, "kind": "gc"}
                                                     for a, b in pauses])}


def test_a_client_pause_longer_than_the_servers_stall_is_left_out():
    s = summarize(_tables(), WINDOW)
    causes = s["stalls"]["by_cause"]
    assert causes["client"]["count"] == 3 and causes["prefill"]["count"] == 3, causes
    assert s["itl_s"]["max"] == pytest.approx(0.82)  # the client's pause: the raw worst gap
    assert s["itl_s"]["max_not_client"] == pytest.approx(0.52)  # the prefill's freeze, the server's
    assert "itl_s.max" in s["validity"]["affected"] and "itl_s.max_not_client" not in s["validity"]["affected"]


def test_without_a_client_pause_it_is_the_worst_gap():
    s = summarize(_tables(pauses=[]), WINDOW)
    assert "client" not in s["stalls"]["by_cause"]
    assert s["itl_s"]["max_not_client"] == s["itl_s"]["max"] == pytest.approx(0.82)


def test_a_stream_frozen_at_the_windows_end_counts_unless_the_client_froze_it():
    frozen = {"d": [t for t in range(4000, 5000, 20)]}  # last token at 4980 ms, then nothing until the cut
    s = summarize(_tables(frozen), WINDOW)
    assert s["stalls"]["open"]["at_window_end"] == 1
    assert s["itl_s"]["max_not_client"] == pytest.approx(1.02)  # 4980 ms to the window's end: the server's
    paused = summarize(_tables(frozen, [(3000, 3790), (4990, 6000)]), WINDOW)
    assert paused["stalls"]["by_cause"]["client"]["count"] == 4
    assert paused["itl_s"]["max_not_client"] == pytest.approx(0.52)


@pytest.mark.parametrize(("extra", "expected"), [({}, 0.52), ({"d": list(range(4000, 5000, 20))}, 1.02)])
def test_the_out_of_core_summary_reads_the_same_figure(tmp_path: Path, extra: dict[str, list[int]], expected: float):
    """analyze_run (summarize_dir: the requests a client stall hit are read again alone, the others' longest gap is
    their span's) equals the in-memory figure: with no other stream, the prefill's 520 ms lies in those requests."""
    tables = _tables(extra)
    for name, table in tables.items():
        (tmp_path / name).mkdir()
        table.write_parquet(tmp_path / name / "part-0.parquet")
    (tmp_path / "run.json").write_text(json.dumps({"run_start_ns": 0, "measure_start_ns": 1000 * MS,
                                                   "end_ns": 6000 * MS}))
    ours = analyze_run(tmp_path)["itl_s"]
    assert ours["max_not_client"] == pytest.approx(expected) and ours["max"] == pytest.approx(0.82)
    assert ours["max_not_client"] == summarize(tables, WINDOW)["itl_s"]["max_not_client"]
