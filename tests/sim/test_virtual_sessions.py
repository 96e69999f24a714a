"""Arriving sessions on the virtual clock: as in the served driver, a session starts at its arrival and sends
each turn exactly when the previous one answered plus its think time; turns due after the window are not sent."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from itlbench.core.engine_config import EngineConfig
from itlbench.load.driver import Warmup
from itlbench.sim.runner import offline_engine
from itlbench.sim.virtual_drive import VirtualDrive, VirtualLimits
from itlbench.workloads.plan import LoadPlan, RequestPlan, SessionPlan

ENGINE = EngineConfig(model="llama-3.1-8b", engine="sim", gpu="h100", max_model_len=8192)


class _Rows:
    def __init__(self) -> None:
        self.tables: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.tables[table].append(row)

    def add_many(self, table: str, rows: list[dict[str, Any]]) -> None:
        self.tables[table].extend(rows)


def _session(at_s: float, stream: int, n: int, think_s: float, max_tokens: int = 20) -> SessionPlan:
    turns = (RequestPlan(f"sess{stream}-t{k}", "agent", "agent", 64, max_tokens, prompt_token_ids=tuple(range(1, 65)),
                         stream=stream, session=f"sess{stream}", turn=k, think_time_s=0.0 if k == 0 else think_s)
             for k in range(n))
    return SessionPlan(at_s, stream, turns)


def _drive(sessions: list[SessionPlan], duration_s: float, streams: int = 0):
    closed = [iter(RequestPlan(f"s{k}-{i}", "agent", "agent", 16, 20, prompt_token_ids=tuple(range(1, 17)))
                   for i in range(10_000)) for k in range(streams)]
    rows = _Rows()
    limits = VirtualLimits(duration_s=duration_s, warmup=Warmup(min_s=0.1, adaptive=True))
    result = VirtualDrive(offline_engine(ENGINE), LoadPlan(streams=closed, sessions=iter(sessions)), rows, limits).run()
    return result, rows.tables["requests"]


def test_each_turn_is_sent_at_the_previous_answers_end_plus_its_think_time() -> None:
    result, reqs = _drive([_session(0.05, 7, 4, 0.1), _session(0.06, 8, 4, 0.2), _session(9.0, 9, 4, 0.1)],
                          duration_s=2.0, streams=1)
    sessions = [r for r in reqs if r["session"] is not None]
    assert {r["stream"] for r in sessions} == {7, 8} and len(sessions) == 8 and result.open_loop_truncated
    for stream, think_ns, arrive_s in ((7, 100_000_000, 0.05), (8, 200_000_000, 0.06)):
        turns = sorted((r for r in sessions if r["stream"] == stream), key=lambda r: r["turn"])
        assert [r["status"] for r in turns] == ["ok"] * 4 and [r["turn"] for r in turns] == [0, 1, 2, 3]
        assert turns[0]["scheduled_ns"] == result.measure_start_ns + int(arrive_s * 1e9)
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt["scheduled_ns"] == nxt["sent_ns"] == prev["done_ns"] + think_ns
    # the closed-loop stream's adaptive warm-up does not wait on sessions, which arrive after it
    assert min(r["scheduled_ns"] for r in sessions) > result.measure_start_ns


def test_turns_due_after_the_window_are_not_sent_and_the_run_ends() -> None:
    result, reqs = _drive([_session(0.0, 3, 10, 0.3)], duration_s=0.5)
    assert [r["turn"] for r in reqs] == [0, 1] and result.counts["sent"] == 2
    assert all(r["scheduled_ns"] < result.end_ns for r in reqs) and result.stop_reason == "completed"
