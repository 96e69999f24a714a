"""The client's pause watchdog: blocked event loops and long garbage collections become records."""

from __future__ import annotations

import asyncio
import gc
import time

from itlbench.load.observers.client_monitor import PauseWatchdog, frozen_heap


def test_blocked_loop_is_recorded_with_its_length():
    rows: list[dict] = []

    async def main() -> None:
        task = asyncio.create_task(PauseWatchdog(rows.append).run())
        await asyncio.sleep(0.05)
        time.sleep(0.12)  # the loop is blocked: nothing can read the network now
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(main())
    blocked = [r for r in rows if r["kind"] == "loop" and (r["end_ns"] - r["start_ns"]) / 1e9 >= 0.10]
    assert len(blocked) == 1  # the 120 ms block, whatever else a busy machine added


def test_long_collection_is_recorded_and_callback_removed():
    rows: list[dict] = []
    dog = PauseWatchdog(rows.append, threshold_s=0.01)
    dog._on_gc("start", {})
    time.sleep(0.03)
    dog._on_gc("stop", {})
    dog._on_gc("start", {})
    dog._on_gc("stop", {})  # a short one is not a pause
    assert [r["kind"] for r in rows] == ["gc"]

    async def main() -> None:
        task = asyncio.create_task(dog.run())
        await asyncio.sleep(0.01)
        assert dog._on_gc in gc.callbacks
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert dog._on_gc not in gc.callbacks


def test_frozen_heap_hides_existing_objects_from_collections():
    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == before
