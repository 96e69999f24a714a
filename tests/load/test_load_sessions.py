"""The driver runs arriving sessions: each starts at its arrival and sends a turn only after the previous one
answered plus its think time, on a stream of its own; drain and stop cover sessions in progress."""

from __future__ import annotations

import asyncio
import itertools

import polars as pl

from itlbench.load.driver import drive
from itlbench.load.multiproc import split_plan
from itlbench.load.target import Target
from itlbench.rundir.store import RunStore
from itlbench.testing.paced_server import PacedConfig, serve_in_thread
from itlbench.workloads.plan import LoadPlan, RequestPlan, SessionPlan
from tests.support.load import run, table

TICK_S = 0.01
THINK_S = 0.1


def _turns(name: str, stream: int, n: int, max_tokens: int = 10, think_s: float = THINK_S):
    for k in range(n):
        yield RequestPlan(f"{name}-t{k}", "agent", "agent", 4, max_tokens, prompt_token_ids=(1, 2, 3, 4),
                          prompt_text="a b c d", stream=stream, session=name, turn=k,
                          think_time_s=0.0 if k == 0 else think_s)


def _sessions(*specs: tuple[float, int, int]) -> LoadPlan:
    return LoadPlan(sessions=iter([SessionPlan(t, stream, _turns(f"sess{stream}", stream, n))
                                   for t, stream, n in specs]))


def test_a_session_sends_each_turn_after_the_previous_answer_plus_its_think_time(tmp_path):
    # two sessions overlap; a third would arrive after the window: never started
    plan = _sessions((0.05, 7, 4), (0.12, 8, 4), (3.0, 9, 4))
    with serve_in_thread(PacedConfig(tick_s=TICK_S)) as (_, url):
        res = run(plan, url, tmp_path, duration_s=1.6, warmup_s=0.1)  # both end by about 0.9 s
    req = table(tmp_path, "requests").sort("scheduled_ns")
    assert res.counts["ok"] == req.height == 8 and res.open_loop_truncated
    assert set(req["stream"].to_list()) == {7, 8} and req.filter(pl.col("stream") == 8)["turn"].to_list() == [0, 1, 2, 3]
    starts = req.filter(pl.col("turn") == 0).sort("stream")
    arrived = [(s - res.measure_start_ns) / 1e9 for s in starts["scheduled_ns"].to_list()]
    assert abs(arrived[0] - 0.05) < 1e-6 and abs(arrived[1] - 0.12) < 1e-6  # at its arrival, from the window's start
    pauses = table(tmp_path, "client_pauses")  # a busy machine's loop stalls, as the watchdog measured them
    slack = TICK_S + ((pauses["end_ns"] - pauses["start_ns"]).max() or 0) / 1e9
    for _, g in req.group_by("stream"):
        g = g.sort("turn")
        done, sched, sent = g["done_ns"].to_list(), g["scheduled_ns"].to_list(), g["sent_ns"].to_list()
        waits = [(s - d) / 1e9 for d, s in zip(done[:-1], sched[1:], strict=True)]
        assert all(THINK_S <= w < THINK_S + slack for w in waits)  # the answer's end + think, never sooner
        assert all(s >= d for d, s in zip(done[:-1], sent[1:], strict=True))
    # the sessions overlapped: concurrency is what the sessions in progress add up to
    spans = [(r["sent_ns"], r["done_ns"], r["stream"]) for r in req.iter_rows(named=True)]
    assert any(a[2] != b[2] and a[0] < b[1] and b[0] < a[1] for a, b in itertools.combinations(spans, 2))


def test_turns_due_after_the_window_are_not_sent(tmp_path):
    plan = LoadPlan(sessions=iter([SessionPlan(0.0, 3, _turns("late", 3, 10, max_tokens=3, think_s=0.5))]))
    with serve_in_thread(PacedConfig(tick_s=TICK_S)) as (_, url):
        res = run(plan, url, tmp_path, duration_s=0.8)
    req = table(tmp_path, "requests")
    assert req.height == res.counts["sent"] == 2  # at 0 and about 0.53 s; the next would be due at about 1.06 s
    assert req["sent_ns"].max() < res.end_ns


def test_a_stop_cancels_a_session_in_progress_and_keeps_its_records(tmp_path):
    plan = LoadPlan(sessions=iter([SessionPlan(0.0, 5, _turns("long", 5, 3, max_tokens=10_000))]))

    async def stop_once_streaming(server, stop: asyncio.Event) -> None:
        while sum(len(v) for v in server.log.values()) < 5:  # the first turn is streaming (load-independent)
            await asyncio.sleep(0.02)
        stop.set()

    async def main(server, url: str):
        stop = asyncio.Event()
        stopper = asyncio.create_task(stop_once_streaming(server, stop))
        store = RunStore(tmp_path)
        try:
            return await drive(plan, Target(url, "paced"), store, duration_s=30, drain_timeout_s=30, stop_event=stop)
        finally:
            stopper.cancel()
            store.close()

    with serve_in_thread(PacedConfig(tick_s=TICK_S)) as (server, url):
        res = asyncio.run(main(server, url))
    assert res.stop_reason == "stop_event" and res.counts["cancelled"] == res.counts["sent"] == 1
    assert (res.end_ns - res.run_start_ns) / 1e9 < 10  # stopped, long before its 30 s and its 10,000 tokens
    assert table(tmp_path, "requests")["status"].to_list() == ["cancelled"]


def test_split_plan_gives_each_session_whole_to_one_worker():
    specs = [(0.1 * i, 10 + i, 2) for i in range(5)]
    parts = [split_plan(_sessions(*specs), k, 2) for k in range(2)]  # each worker builds the plan itself
    got = [[(s.stream, [t.request_id for t in s.turns]) for s in p.sessions] for p in parts]
    assert [[stream for stream, _ in g] for g in got] == [[10, 12, 14], [11, 13]]
    assert all(ids == [f"sess{stream}-t0", f"sess{stream}-t1"] for g in got for stream, ids in g)
