"""Run store: a run directory of parquet part files flushed as the run goes, plus JSON documents.

Each table is a folder (`requests/`, `chunks/`, `steps/`, ...) of `part-NNNNN.parquet` files, so
an interrupted run keeps every part already flushed and the last buffer is written on close.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.rundir.schema import TABLES, frame


class RunStore:
    """Buffers rows per table and appends them as parquet parts every `flush_every_s` seconds."""

    def __init__(self, run_dir: str | Path, flush_every_s: float = 2.0, max_buffer_rows: int = 100_000) -> None:
        self.path = Path(run_dir)
        self.path.mkdir(parents=True, exist_ok=True)
        self.flush_every_s = flush_every_s
        self.max_buffer_rows = max_buffer_rows
        self._buffers: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
        self._frames: dict[str, list[pl.DataFrame]] = {name: [] for name in TABLES}  # column-built batches
        self._parts: dict[str, int] = {name: 0 for name in TABLES}
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()

    def add(self, table: str, row: dict[str, Any]) -> None:
        with self._lock:
            buf = self._buffers[table]
            buf.append(row)
            full = len(buf) >= self.max_buffer_rows
        if full:
            self.flush(table)

    def add_many(self, table: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            with self._lock:
                self._buffers[table].extend(rows)
            self.maybe_flush()

    def add_frame(self, table: str, df: pl.DataFrame) -> None:
        """A batch already built column-wise with the table's schema (see schema.columns_frame)."""
        if df.height:
            with self._lock:
                self._frames[table].append(df)
            self.maybe_flush()

    def maybe_flush(self) -> None:
        """Flush when the interval has passed; cheap to call from hot loops."""
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self, table: str | None = None) -> None:
        names = [table] if table else list(TABLES)
        for name in names:
            with self._lock:
                rows, self._buffers[name] = self._buffers[name], []
                frames, self._frames[name] = self._frames[name], []
                part = self._parts[name]
                if rows or frames:
                    self._parts[name] += 1
            if rows or frames:
                self._write_part(name, part, rows, frames)
        self._last_flush = time.monotonic()

    def _write_part(self, table: str, part: int, rows: list[dict[str, Any]],
                    frames: list[pl.DataFrame] | None = None) -> None:
        folder = self.path / table
        folder.mkdir(exist_ok=True)
        tmp = folder / f".part-{part:05d}.parquet.tmp"
        df = frame(table, rows)
        if frames:
            df = pl.concat([df, *frames]) if rows else pl.concat(frames)
        df.write_parquet(tmp)
        os.replace(tmp, folder / f"part-{part:05d}.parquet")

    def write_json(self, name: str, obj: Any) -> Path:
        """Atomically (tmp + rename) write `name` (e.g. "run.json") so readers never see half a file."""
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
        os.replace(tmp, target)
        return target

    def close(self) -> None:
        self.flush()
