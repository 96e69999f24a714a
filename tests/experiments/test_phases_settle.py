"""`phases` reads the engine's step log after the client is done: it must wait for the log to catch up."""

from __future__ import annotations

import asyncio
import time

from itlbench.experiments.phases import _Rows, _settle


def _rows(outputs: list[int]) -> _Rows:
    rows = _Rows()
    for i, n in enumerate(outputs):
        rows.add("requests", {"request_id": f"r{i}", "sent_ns": 1_000 + i, "output_tokens": n})
    return rows


def _steps(rows: _Rows, decode_tokens: list[int], start_ns: int = 2_000) -> None:
    for i, d in enumerate(decode_tokens):
        rows.add("steps", {"step": i, "start_ns": start_ns + i, "end_ns": start_ns + i + 1, "prefill_tokens": 0,
                           "decode_tokens": d})


def test_settle_waits_until_the_log_holds_every_decoded_token() -> None:
    """Two requests of 8 tokens: 14 came from decode steps. The log's last steps arrive 0.2 s late; step times
    could not tell (a tiny model's whole batch fits inside any slack), the decode counts can."""
    rows = _rows([8, 8])
    _steps(rows, [2, 2, 2])  # 6 of the 14 so far

    async def late_steps() -> None:
        await asyncio.sleep(0.2)
        _steps(rows, [2, 2, 2, 2], start_ns=3_000)

    async def main() -> float:
        task = asyncio.create_task(late_steps())
        t0 = time.monotonic()
        await _settle(object(), rows, timeout_s=5.0)  # type: ignore[arg-type]
        await task
        return time.monotonic() - t0

    waited = asyncio.run(main())
    assert 0.15 < waited < 2.0
    assert sum(s["decode_tokens"] for s in rows.tables["steps"]) == 14


def test_settle_gives_up_after_its_timeout_and_ignores_steps_from_before_the_run() -> None:
    """Steps that started before the first request (another client's) do not count; a log that never
    catches up costs the timeout, not a hang."""
    rows = _rows([5])
    _steps(rows, [4], start_ns=0)  # before the request was sent
    t0 = time.monotonic()
    asyncio.run(_settle(object(), rows, timeout_s=0.3))  # type: ignore[arg-type]
    assert 0.25 < time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    asyncio.run(_settle(None, rows, timeout_s=5.0))  # no step log to follow: nothing to wait for
    assert time.monotonic() - t0 < 0.1
