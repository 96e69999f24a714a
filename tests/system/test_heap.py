"""The collector stays away from a serving process's long-lived data: its startup heap is frozen and
the step-log mirror holds records the collector does not track."""

from __future__ import annotations

import gc

from itlbench.core.steps import StepLog, StepRecord
from itlbench.system.heap import freeze_heap


def record(step: int) -> StepRecord:
    return StepRecord(step=step, phase="decode", prefill_tokens=0, decode_tokens=8, num_prefill_reqs=0,
                      num_decode_reqs=8, num_running=8, num_waiting=0, num_preemptions=0, kv_usage=0.25,
                      token_budget=2048, start_ns=step * 1_000, end_ns=step * 1_000 + 900,
                      prefill_request_ids=(f"req-{step}",), forward_ns=700)


def test_step_log_rows_are_untracked_and_come_back_as_records() -> None:
    log = StepLog(capacity=1_000)
    originals = [record(i) for i in range(1_500)]
    for r in originals:
        log.append(r)
    gc.collect()
    assert not any(gc.is_tracked(row) for row in log._rows)  # a full collection skips all 1,000
    assert log.last_step == 1_499
    assert log.since(1_490) == originals[1_490:]
    assert log.since(0) == originals[500:]  # the oldest 500 fell off the bounded log
    assert log.since(1_500) == []


def test_freeze_heap_moves_the_startup_heap_out_of_collections() -> None:
    try:
        frozen = freeze_heap()
        assert frozen == gc.get_freeze_count() > 1_000
        assert len(gc.get_objects(generation=2)) < 100  # nothing old is left for a full collection to scan
    finally:
        gc.unfreeze()
