"""Row hand-off from the event loop to the run store, off the loop thread.

Parquet writes take milliseconds; done on the loop they would delay reading sockets and so shift
every chunk timestamp taken meanwhile. The loop only appends to lists; a worker thread feeds the store.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, Protocol

from itlbench.rundir.schema import TABLES, columns_frame
from itlbench.rundir.store import RunStore


class RowWriter(Protocol):
    def add(self, table: str, row: dict[str, Any]) -> None: ...


class RowSink:
    """Buffers rows per table; `pump()` hands them to the store in a thread, `close()` flushes."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._pending: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self._columns: dict[str, dict[str, list[Any]]] = {}  # column-wise batches (chunk rows)
        self.dropped: dict[str, int] = {}
        self._busy: asyncio.Future[None] | None = None

    def add(self, table: str, row: dict[str, Any]) -> None:
        self._pending[table].append(row)

    def extend(self, table: str, rows: list[dict[str, Any]]) -> None:
        self._pending[table].extend(rows)

    def add_columns(self, table: str, columns: dict[str, list[Any]]) -> None:
        """Rows as equal-length columns: extended in place, one frame per hand-off, no dict per row."""
        mine = self._columns.get(table)
        if mine is None:
            self._columns[table] = {k: list(v) for k, v in columns.items()}
            return
        for k, v in columns.items():
            mine[k].extend(v)

    def _take(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, list[Any]]]]:
        pending, self._pending = self._pending, defaultdict(list)
        columns, self._columns = self._columns, {}
        return pending, columns

    def _hand_off(self, taken: tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, list[Any]]]]) -> None:
        pending, columns = taken
        for table, rows in pending.items():
            if table in TABLES:
                self.store.add_many(table, rows)
            else:  # a table this store does not know (schema not registered): count, don't crash
                self.dropped[table] = self.dropped.get(table, 0) + len(rows)
        for table, cols in columns.items():
            if table in TABLES:
                self.store.add_frame(table, columns_frame(table, cols))
            else:
                self.dropped[table] = self.dropped.get(table, 0) + len(next(iter(cols.values()), []))

    async def pump(self) -> None:
        """Hand pending rows over in a thread; a cancelled caller does not abandon the hand-off."""
        taken = self._take()
        if taken[0] or taken[1]:
            self._busy = asyncio.ensure_future(asyncio.to_thread(self._hand_off, taken))
            await asyncio.shield(self._busy)

    async def aclose(self) -> None:
        """Wait for a hand-off still running, then write everything left."""
        if self._busy is not None:
            await asyncio.gather(self._busy, return_exceptions=True)
        self.close()

    def close(self) -> None:
        self._hand_off(self._take())
        self.store.flush()
