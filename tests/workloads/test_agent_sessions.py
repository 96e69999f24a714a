"""Agent sessions arriving at --rate: sessions (not turns) arrive open-loop, each then runs its turns in order."""

from __future__ import annotations

import numpy as np
import pytest

from itlbench.errors import ConfigError
from itlbench.harness.orchestrate import _preflight
from itlbench.harness.run_config import RunConfig
from itlbench.workloads import LoadSpec, build_load_plan

LONG = 131072  # a context no session fills: every session draws its 3-8 turns


def _plan(**kw: object):
    args: dict = {"workload": "agent", "rate": 4.0, "duration_s": 100.0, "max_model_len": LONG, "seed": 3}
    args.update(kw)
    return build_load_plan(LoadSpec(**args))


def test_sessions_arrive_at_the_rate_each_on_a_stream_after_the_closed_loop_ones() -> None:
    plan = _plan(streams=2)
    sessions = list(plan.sessions)
    times = [s.arrive_at_s for s in sessions]
    assert 320 <= len(sessions) <= 480  # 4/s over 100 s: 400 Poisson arrivals, ±4 standard deviations
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 100
    assert [s.stream for s in sessions] == list(range(2, 2 + len(sessions)))
    assert list(plan.open_loop) == []  # no turn is an open-loop arrival of its own
    assert [next(s).stream for s in plan.streams] == [0, 1]  # --streams keep their closed-loop sessions
    desc = plan.description
    assert desc["sessions"]["rate"] == 4.0 and desc["sessions"]["first_stream"] == 2
    assert desc["sessions"]["unit"] == "sessions/s" and desc["sessions"]["mean_turns"] == 5.5
    assert desc["warnings"] == []
    assert "sessions" not in _plan(workload="chat").description  # other workloads' --rate sends requests


def test_each_sessions_turns_are_ordered_extend_their_prompt_and_carry_think_time() -> None:
    sessions = list(_plan(duration_s=20.0).sessions)
    thinks = []
    for s in sessions:
        turns = list(s.turns)
        assert 3 <= len(turns) <= 8 and [t.turn for t in turns] == list(range(len(turns)))
        assert {t.session for t in turns} == {turns[0].session} and {t.stream for t in turns} == {s.stream}
        assert turns[0].think_time_s == 0 and all(t.think_time_s > 0 for t in turns[1:])
        assert all(t.send_at_s is None for t in turns)  # sent when the session's stream is free, not on a clock
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.prompt_token_ids[:prev.prompt_tokens] == prev.prompt_token_ids
        thinks += [t.think_time_s for t in turns[1:]]
    assert len(thinks) > 200 and 0.8 < np.mean(thinks) < 1.2  # exponential, mean think_time_mean_s = 1 s


def test_a_sessions_turns_do_not_depend_on_when_they_are_drawn() -> None:
    """Sessions run side by side, so their turns are drawn interleaved: each has its own generator."""
    in_order = [[(t.request_id, t.prompt_token_ids, t.think_time_s) for t in s.turns]
                for s in _plan(duration_s=5.0).sessions]
    sessions = list(_plan(duration_s=5.0).sessions)
    iters = [iter(s.turns) for s in sessions]
    drawn: list[list[tuple]] = [[] for _ in sessions]
    while any(iters):
        for i in reversed(range(len(iters))):
            t = next(iters[i], None) if iters[i] is not None else None
            if t is None:
                iters[i] = None
            else:
                drawn[i].append((t.request_id, t.prompt_token_ids, t.think_time_s))
    assert drawn == in_order and len({r[0] for s in drawn for r in s}) == sum(len(s) for s in drawn)


def test_locust_refuses_agent_sessions_at_a_rate_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        _preflight(RunConfig(workload="agent", rate=2.0, driver="locust"))
    assert err.value.field == "--driver" and "--streams N" in err.value.fix and "--workers N" in err.value.fix
