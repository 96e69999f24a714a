"""Shared helpers for the load tests: plan builders and run-directory readers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.load.driver import DriveResult, drive
from itlbench.load.target import Target
from itlbench.rundir.reader import read_table
from itlbench.rundir.store import RunStore
from itlbench.workloads.plan import LoadPlan, RequestPlan


def plans(prefix: str, max_tokens: int, count: int | None = None, **kw: Any) -> Iterator[RequestPlan]:
    i = 0
    while count is None or i < count:
        yield RequestPlan(f"{prefix}-{i}", "chat", "chat", 4, max_tokens, prompt_token_ids=(1, 2, 3, 4),
                          prompt_text="a b c d", **kw)
        i += 1


def closed(n: int, max_tokens: int) -> LoadPlan:
    return LoadPlan(streams=[plans(f"s{k}", max_tokens) for k in range(n)])


def four_streams() -> LoadPlan:
    """Four closed-loop streams of 5-token requests: a plan factory for spawned load workers, which import it."""
    return closed(4, 5)


def run(plan: LoadPlan, url: str, run_dir: Path, target_kw: dict[str, Any] | None = None,
        **kw: Any) -> DriveResult:
    store = RunStore(run_dir)
    kw.setdefault("drain_timeout_s", 5.0)
    try:
        return asyncio.run(drive(plan, Target(url, "paced", **(target_kw or {})), store, **kw))
    finally:
        store.close()


def table(run_dir: Path, name: str) -> pl.DataFrame:
    """One table through the run directory's own reader (an absent table is empty, with its schema)."""
    return read_table(run_dir, name)
