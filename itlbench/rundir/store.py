"""Run store: a run directory of parquet part files flushed as the run goes, plus JSON documents.

Each table is a folder (`requests/`, `chunks/`, `steps/`, ...) of `part-NNNNN.parquet` files, so
an interrupted run keeps every part already flushed and the last buffer is written on close.

A flush never loses a buffer. Cells of the wrong type (a peer's doing) are coerced or nulled
(`schema.typed_frame`, counted in `coerced`); a part that still cannot be written as parquet is
quarantined: its rows go to `<table>/quarantine-NNNNN.jsonl` (JSON lines, anything unknown as its
repr), counted in `quarantined` and listed in `quarantine.json` at the run's root. Rows that cannot
even be quarantined (the disk refuses everything) stay buffered for the next flush, and `close`
says how many could not be written.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.errors import ItlbenchError
from itlbench.rundir.coerce import loose_json
from itlbench.rundir.schema import TABLES, rows_columns, typed_frame

log = logging.getLogger("itlbench.rundir")
QUARANTINE_DOC = "quarantine.json"


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
        self._rows_written: dict[str, int] = {name: 0 for name in TABLES}
        self.coerced: dict[str, int] = {}  # cells coerced or nulled to fit their column, per table
        self.quarantined: dict[str, int] = {}  # rows written as JSON lines instead of parquet, per table
        self._quarantine_doc: dict[str, Any] = {}
        self._on_flush: Any = None  # keep_doc_current's update
        self._doc_stop: threading.Event | None = None
        self._json_lock = threading.Lock()
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
        hook = self._on_flush
        if hook is not None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - a document that cannot be refreshed must not stop the records
                log.exception("refreshing the run document")

    def keep_doc_current(self, name: str, doc: dict[str, Any], *, run_start_ns: int, measure_start_ns: int,
                         planned_end_ns: int) -> None:
        """Write `name` (run.json) now with the run's window, and again after every flush with `end_ns`
        at that flush (never past the planned end), marked `"provisional": true`: a run killed with
        SIGKILL leaves a document `itlbench analyze` can read. The final document replaces it."""
        snap = json.loads(json.dumps(doc, default=str))  # a copy: the caller keeps changing `doc`
        snap.update(run_start_ns=run_start_ns, measure_start_ns=measure_start_ns, end_ns=measure_start_ns,
                    provisional=True)

        stop = threading.Event()  # set before the final document is written: no refresh may follow it

        def update() -> None:
            snap["end_ns"] = max(measure_start_ns, min(planned_end_ns, time.perf_counter_ns()))
            self.write_json(name, snap, unless=stop)

        self.write_json(name, snap)
        self._on_flush = update
        # also on a clock: with several client processes, the parts are flushed by their stores, not this one
        self._doc_stop = stop

        def tick() -> None:
            while not stop.wait(self.flush_every_s):
                hook = self._on_flush
                if hook is None:
                    return
                try:
                    hook()
                except Exception:  # noqa: BLE001 - the records matter more than the document
                    log.exception("refreshing the run document")

        threading.Thread(target=tick, name="itlbench-run-doc", daemon=True).start()

    def stop_keeping_doc(self) -> None:
        self._on_flush = None
        if self._doc_stop is not None:
            self._doc_stop.set()

    def _write_part(self, table: str, part: int, rows: list[dict[str, Any]],
                    frames: list[pl.DataFrame] | None = None) -> None:
        folder = self.path / table
        try:
            folder.mkdir(exist_ok=True)
            tmp = folder / f".part-{part:05d}.parquet.tmp"
            df, coerced = typed_frame(table, rows_columns(table, rows)) if rows else (None, 0)
            if frames:
                df = pl.concat([df, *frames]) if df is not None else pl.concat(frames)
            assert df is not None
            df.write_parquet(tmp)
            os.replace(tmp, folder / f"part-{part:05d}.parquet")
        except Exception as exc:  # noqa: BLE001 - the rows are kept another way, never dropped
            self._quarantine(table, part, rows, frames or [], exc)
            return
        with self._lock:
            self._rows_written[table] += df.height
            if coerced:
                self.coerced[table] = self.coerced.get(table, 0) + coerced

    def _quarantine(self, table: str, part: int, rows: list[dict[str, Any]], frames: list[pl.DataFrame],
                    exc: BaseException) -> None:
        """Write a part that parquet refused as JSON lines; if even that fails, keep it buffered."""
        path = self.path / table / f"quarantine-{part:05d}.jsonl"
        n = len(rows) + sum(f.height for f in frames)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as f:
                for row in rows:
                    f.write(loose_json(row) + "\n")
                for df in frames:
                    for row in df.iter_rows(named=True):
                        f.write(loose_json(row) + "\n")
        except Exception:  # noqa: BLE001 - the disk refuses: keep the rows for the next flush
            log.exception("cannot quarantine %d %s rows to %s", n, table, path)
            with self._lock:
                self._buffers[table][:0] = rows
                self._frames[table][:0] = frames
            return
        log.warning("%d %s rows could not be written as parquet (%s: %s); kept in %s", n, table,
                    type(exc).__name__, exc, path)
        with self._lock:
            self.quarantined[table] = self.quarantined.get(table, 0) + n
            entry = self._quarantine_doc.setdefault(table, {"rows": 0, "files": [], "errors": []})
            entry["rows"] += n
            entry["files"].append(f"{table}/{path.name}")
            if len(entry["errors"]) < 10:
                entry["errors"].append(f"{type(exc).__name__}: {str(exc)[:300]}")
            doc = json.loads(json.dumps(self._quarantine_doc))
        try:
            self.write_json(QUARANTINE_DOC, doc)
        except OSError:
            log.exception("cannot write %s", QUARANTINE_DOC)

    def rows_written(self, table: str) -> int:
        with self._lock:
            return self._rows_written[table]

    def write_json(self, name: str, obj: Any, unless: threading.Event | None = None) -> Path:
        """Atomically (tmp + rename) write `name` (e.g. "run.json") so readers never see half a file;
        not at all once `unless` is set (checked under the lock the final write also takes)."""
        target = self.path / name
        text = json.dumps(obj, indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"
        with self._json_lock:  # the flush thread refreshes run.json while the run's thread may write it
            if unless is not None and unless.is_set():
                return target
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, target)
        return target

    def unwritten(self) -> dict[str, int]:
        """Rows still buffered (after `close`: rows the disk refused even as JSON lines)."""
        with self._lock:
            return {t: len(self._buffers[t]) + sum(f.height for f in self._frames[t]) for t in TABLES
                    if self._buffers[t] or self._frames[t]}

    def close(self) -> None:
        self.flush()
        self.stop_keeping_doc()
        left = self.unwritten()
        if left:
            raise ItlbenchError(f"could not write {', '.join(f'{n} {t} rows' for t, n in left.items())} "
                                f"to {self.path} (see the log): free disk space or choose another --out")
