"""Kernel stamps in the analysis: a busy client no longer voids ITL, shared reads and clock steps do."""

from __future__ import annotations

import polars as pl

from itlbench.analysis.itl import gap_table, pooled, steady
from itlbench.analysis.stalls import StallParams, analyze_stalls
from itlbench.analysis.ttft import ttft_table
from itlbench.analysis.validity import check_validity
from itlbench.rundir.schema import frame

MS = 1_000_000
STREAMS = 8
TICKS = 200  # 8 streams × 199 gaps: enough for a supported p99


def _chunks(stamp: str, shared_every: int = 0, streams_sharing: int = STREAMS) -> pl.DataFrame:
    """STREAMS streams, a chunk every 20 ms, read 0.2 ms after arrival; in the first `streams_sharing`
    streams every `shared_every`-th chunk is read together with the next one (both carry the later
    stamp; the earlier arrived 20 ms before)."""
    rows = []
    for s in range(STREAMS):
        for i in range(TICKS):
            every = shared_every if s < streams_sharing else 0
            arrival = (1000 + 20 * i) * MS + s * 1000
            stamp_t = arrival
            read_chunks = 1
            if every and i % every == 0 and i + 1 < TICKS:
                stamp_t, read_chunks = arrival + 20 * MS, 2
            elif every and i % every == 1:
                read_chunks = 2
            t_read = stamp_t + MS // 5
            rows.append({"request_id": f"r{s}", "index": i, "n_tokens": 1, "stamp": stamp,
                         "t_ns": stamp_t if stamp == "kernel" else t_read, "t_read_ns": t_read,
                         "read_chunks": read_chunks})
    return frame("chunks", rows)


def _requests() -> pl.DataFrame:
    return frame("requests", [{"request_id": f"r{s}", "server_request_id": f"s{s}", "cls": "chat", "injected": False,
                               "stream": s, "prompt_tokens": 100, "scheduled_ns": 900 * MS, "sent_ns": 900 * MS,
                               "first_token_ns": 1000 * MS, "status": "ok"} for s in range(STREAMS)])


def _busy_samples(offsets: list[int] | None = None) -> pl.DataFrame:
    offs = offsets or [1_700_000_000 * 10**9] * 20
    return frame("client_samples", [{"t_ns": (1000 + 200 * k) * MS, "loop_lag_s": 0.015, "cpu_percent": 90.0,
                                     "in_flight": STREAMS, "clock_offset_ns": o} for k, o in enumerate(offs)])


def _verdict(chunks: pl.DataFrame, samples: pl.DataFrame) -> dict[str, object]:
    reqs = _requests()
    gaps = steady(gap_table(chunks, reqs))
    return check_validity(ttft_table(reqs, frame("steps", [])), samples, pooled(gaps), gaps=gaps)


def test_busy_client_voids_user_stamped_itl_but_not_kernel_stamped() -> None:
    user = _verdict(_chunks("user"), _busy_samples())
    assert {"itl_s", "stalls"} <= set(user["affected"]) and "itl_s" not in user["standing"]
    kernel = _verdict(_chunks("kernel"), _busy_samples())
    assert "itl_s" in kernel["standing"] and "stalls" in kernel["standing"]
    assert "ttft_s" in kernel["affected"]  # a busy client still sends late
    assert any("kernel receive stamps still hold" in r for r in kernel["reasons"])
    f = kernel["figures"]
    assert f["kernel_stamped_share"] == 1.0 and f["shared_read_share"] == 0.0 and f["stamp_late_bound_s"] == 0.0


def test_shared_reads_bend_kernel_stamped_itl() -> None:
    v = _verdict(_chunks("kernel", shared_every=10), _busy_samples())
    assert "itl_s" in v["affected"]
    (reason,) = [r for r in v["reasons"] if "read together" in r]
    assert reason.startswith("19.6% of kernel-stamped gaps")  # each shared chunk bounds the gaps on both sides
    assert v["figures"]["stamp_late_bound_s"] > 0.015  # the earlier chunk's stamp is a tick late
    rare = _verdict(_chunks("kernel", shared_every=150, streams_sharing=1), _busy_samples())  # 0.25 %: p99 stands
    assert "itl_s" in rare["standing"]


def test_a_wall_clock_step_is_recorded_and_bends_no_kernel_stamp() -> None:
    """Every read re-checks the stamps' offset (tests/load/test_kernel_clock.py steps the real clock), so the step is a
    figure, not a reason."""
    base = 1_700_000_000 * 10**9
    v = _verdict(_chunks("kernel"), _busy_samples([base] * 10 + [base + 4 * MS] * 10))
    assert v["figures"]["clock_step_s"] == 0.004
    assert not any("wall clock" in r for r in v["reasons"]) and "itl_s" in v["standing"]


def test_gap_late_bounds() -> None:
    """The earlier of two chunks read together is late by at most the time since the previous read."""
    rows = [{"request_id": "a", "index": i, "n_tokens": 1, "stamp": "kernel", "t_ns": t, "t_read_ns": tr,
             "read_chunks": k} for i, (t, tr, k) in enumerate([(100, 101, 1), (140, 141, 2), (140, 141, 2),
                                                              (160, 161, 1)])]
    reqs = frame("requests", [{"request_id": "a", "injected": False, "sent_ns": 50}])
    g = gap_table(frame("chunks", rows), reqs)
    # chunk 1 shares its read with chunk 2: it arrived after chunk 0's read (101), so ≤ 39 ns late
    assert g["late_bound_ns"].to_list() == [39, 39, 0]
    assert g["stamp"].to_list() == ["kernel"] * 3
    mixed = gap_table(frame("chunks", [{**rows[0], "stamp": "user"}, rows[3]]), reqs)
    assert mixed["stamp"].to_list() == ["user"] and mixed["late_bound_ns"].to_list() == [None]


def test_a_client_pause_is_not_a_kernel_stamped_stalls_cause() -> None:
    """The same stall over a client GC pause: the client's with user stamps, the server's with kernel ones."""
    times = [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 400, 410, 420]
    reqs = frame("requests", [{"request_id": "a", "server_request_id": "sa", "injected": False, "sent_ns": 0}])
    pauses = frame("client_pauses", [{"start_ns": 105 * MS, "end_ns": 395 * MS, "kind": "gc"}])
    causes = {}
    for stamp in ("user", "kernel"):
        chunks = frame("chunks", [{"request_id": "a", "index": i, "t_ns": t * MS, "n_tokens": 1, "stamp": stamp,
                                   "t_read_ns": t * MS + (0 if stamp == "user" else 5_000), "read_chunks": 1}
                                  for i, t in enumerate(times)])
        report = analyze_stalls(gap_table(chunks, reqs), frame("steps", []), reqs, StallParams(), 0, pauses)
        (stall,) = report.stalls.to_dicts()
        causes[stamp] = (stall["cause"], stall["client_pause_s"])
    assert causes["user"][0] == "client" and causes["kernel"] == ("unknown", 0.0)  # no step log: not the client
