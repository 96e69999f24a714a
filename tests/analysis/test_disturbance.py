"""What disturbed the path to the engine, in the validity verdict: cut or silent connections (those
live in the window, whenever scheduled), and first tokens delivered late after their engine step."""

from __future__ import annotations

from itlbench.analysis import RunWindow, summarize
from itlbench.analysis.disturbance import first_token_delivery_lag, live_in
from itlbench.rundir.schema import frame

MS = 1_000_000
WINDOW = RunWindow(run_start_ns=0, measure_start_ns=1000 * MS, end_ns=5000 * MS)


def _req(rid: str, sched_ms: int, first_ms: int | None, done_ms: int | None, status: str = "ok",
         kind: str | None = None) -> dict[str, object]:
    return {"request_id": rid, "server_request_id": f"srv-{rid}", "cls": "chat", "stream": 0, "injected": False,
            "prompt_tokens": 100, "max_tokens": 10, "output_tokens": 10, "scheduled_ns": sched_ms * MS,
            "sent_ns": sched_ms * MS, "first_token_ns": None if first_ms is None else first_ms * MS,
            "done_ns": None if done_ms is None else done_ms * MS, "status": status, "error_kind": kind}


def _step(i: int, start_ms: int, end_ms: int, prefill: list[str]) -> dict[str, object]:
    return {"step": i, "phase": "prefill", "prefill_tokens": 100, "decode_tokens": 0, "num_prefill_reqs": len(prefill),
            "num_decode_reqs": 0, "num_running": 1, "num_waiting": 0, "num_preemptions": 0, "kv_usage": 0.0,
            "token_budget": None, "start_ns": start_ms * MS, "end_ns": end_ms * MS, "prefill_request_ids": prefill}


def _verdict(requests: list[dict[str, object]], steps: list[dict[str, object]] | None = None) -> dict[str, object]:
    s = summarize({"requests": frame("requests", requests), "steps": frame("steps", steps or [])}, WINDOW)
    return {"valid": s["valid"], **s["validity"]}  # type: ignore[dict-item]


def test_cut_and_silent_connections_are_named_by_kind_drains_and_http_errors_are_not():
    ok = [_req(f"r{i}", 1000 + 100 * i, 1050 + 100 * i, 1500 + 100 * i) for i in range(6)]
    v = _verdict(ok + [_req("h", 1100, None, 1200, "error", "http_status"),
                       _req("d", 4000, 4100, 5100, "cancelled", "cancelled")])
    assert v["valid"] is True and v["disturbances"] == [], v["reasons"]
    v = _verdict(ok + [_req("c", 1200, 1300, 1400, "error", "closed"),
                       _req("w", 200, None, 4200, "timeout", "no_headers")])  # silent from the warmup on
    (reason,) = v["disturbances"]
    assert v["valid"] is False and reason in v["reasons"]
    assert reason.startswith("2 of 8 requests lost their connection (closed 1, no_headers 1)")
    assert "(1 before a first token)" in reason
    assert {"ttft_s", "itl_s", "goodput", "throughput"} <= set(v["affected"])
    assert v["figures"]["transport_failures_by_kind"] == {"closed": 1, "no_headers": 1}


def test_live_in_takes_requests_in_flight_during_the_window():
    req = frame("requests", [_req("before", 100, 150, 900), _req("across", 100, None, 1200, "timeout", "timeout"),
                             _req("after", 5000, None, None), _req("open", 4000, None, None)])
    assert live_in(req, 1000 * MS, 5000 * MS)["request_id"].to_list() == ["across", "open"]


def test_first_tokens_late_after_their_step_are_named_as_time_outside_the_engine():
    # the step that ends a request's prefill makes its first token; chunked: the last of its steps
    steps = [_step(0, 1000, 1010, ["srv-a"]), _step(1, 1010, 1020, ["srv-a", "srv-b"])] + \
        [_step(2 + i, 1100 + 100 * i, 1110 + 100 * i, [f"srv-r{i}"]) for i in range(4)]
    near = [_req("a", 990, 1021, 1500), _req("b", 1000, 1022, 1500)] + \
        [_req(f"r{i}", 1090 + 100 * i, 1112 + 100 * i, 1600 + 100 * i) for i in range(4)]
    lag = first_token_delivery_lag(frame("requests", near), frame("steps", steps))
    assert sorted(lag.to_list()) == [0.001, 0.002, 0.002, 0.002, 0.002, 0.002]
    assert _verdict(near, steps)["disturbances"] == []
    far = [{**r, "first_token_ns": r["first_token_ns"] + 60 * MS} for r in near]  # type: ignore[operator]
    v = _verdict(far, steps)
    (reason,) = v["disturbances"]
    assert reason.startswith("first tokens reached the client a median 62.0 ms") and "outside the engine" in reason
    assert {"ttft_s", "goodput"} <= set(v["affected"]) and v["figures"]["delivery_lag_count"] == 6
    assert "itl_s" in v["standing"], "a constant delay moves TTFT, not the gaps"


def test_a_delay_small_against_the_ttft_stands():
    steps = [_step(i, 1000 + 100 * i, 1900 + 100 * i, [f"srv-r{i}"]) for i in range(4)]
    reqs = [_req(f"r{i}", 1000 + 100 * i, 1920 + 100 * i, 2500 + 100 * i) for i in range(4)]  # 20 ms of 920
    assert _verdict(reqs, steps)["disturbances"] == []
