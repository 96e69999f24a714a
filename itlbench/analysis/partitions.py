"""The chunks table of a large run, split by request so that each piece fits in memory.

Every figure that needs a stream's chunks in order (its gaps, their stamps' late bounds, its median
gap and stalls, its TPOT, its own p99 for goodput) needs all of that one request's chunks and nothing
else, so the table is hash-partitioned on `request_id`: a request's chunks all land in one partition,
whichever parquet parts (flushed every 2 s while the run went) they were written to. Each partition
is then analysed alone, with the in-memory functions, and the results merged (analysis/scale.py).

The partitions are uncompressed Arrow IPC files in a temporary directory (TMPDIR), written by the
polars streaming engine in one pass over the run's parts; a run of up to `ROWS_PER_PARTITION` chunk
rows is read as one partition directly, with no temporary files.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from itlbench.rundir.reader import conform, read_table, table_parts
from itlbench.rundir.schema import CHUNK_SCHEMA

ROWS_PER_PARTITION = 1_000_000  # ~0.4 KB per row while a partition's gaps are computed: ~400 MB
KEY = "_partition"
SEED = 0x17B


def chunk_parts(run_dir: str | Path) -> list[Path]:
    """The chunks' readable parts, a killed multi-process run's unmerged worker parts included."""
    return table_parts(run_dir, "chunks")


def chunk_rows(run_dir: str | Path) -> int:
    """Rows in the run's chunk parts, from the parquet footers (no column is read)."""
    parts = chunk_parts(run_dir)
    if not parts:
        return 0
    try:
        return int(pl.scan_parquet(parts).select(pl.len()).collect().item())
    except pl.exceptions.PolarsError:  # parts of differing schemas: count them one by one
        return sum(int(pl.scan_parquet(p).select(pl.len()).collect().item()) for p in parts)


def partition_count(rows: int, rows_per_partition: int = ROWS_PER_PARTITION) -> int:
    return max(1, math.ceil(rows / max(1, rows_per_partition)))


def _key(n: int) -> pl.Expr:
    return (pl.col("request_id").hash(SEED) % n).alias(KEY)


def _split_streaming(parts: list[Path], n: int, out: Path) -> list[list[Path]]:
    """One streaming pass: every part conformed to the chunk schema, hashed, sunk by key."""
    scan = pl.scan_parquet(parts, schema=CHUNK_SCHEMA, missing_columns="insert", extra_columns="ignore")
    scan.with_columns(_key(n)).sink_ipc(pl.PartitionBy(out, key=KEY, include_key=False), mkdir=True)
    return [sorted((out / f"{KEY}={i}").glob("*.ipc")) for i in range(n)]


def _split_by_part(parts: list[Path], n: int, out: Path) -> list[list[Path]]:
    """The same split part by part, for polars versions without partitioned sinks."""
    files: list[list[Path]] = [[] for _ in range(n)]
    for j, part in enumerate(parts):
        df = conform(pl.read_parquet(part), CHUNK_SCHEMA).with_columns(_key(n))
        for (key,), piece in df.partition_by(KEY, as_dict=True, include_key=False).items():
            path = out / f"{int(key)}-{j:05d}.ipc"  # type: ignore[call-overload]
            piece.write_ipc(path)
            files[int(key)].append(path)  # type: ignore[call-overload]
    return files


def _split(parts: list[Path], n: int, out: Path, streaming: bool) -> list[list[Path]]:
    """Streamed where polars can; part by part where it cannot, or where a part is not typed as itlbench writes it
    (the streaming scan casts strictly and fails on text in t_ns; `conform` coerces a cell or nulls it, as every
    other reader of the run does)."""
    if streaming and hasattr(pl, "PartitionBy"):
        streamed = out / "streamed"
        streamed.mkdir()
        try:
            return _split_streaming(parts, n, streamed)
        except pl.exceptions.PolarsError:
            shutil.rmtree(streamed, ignore_errors=True)
    return _split_by_part(parts, n, out)


@contextmanager
def partitions(run_dir: str | Path, count: int | None = None, streaming: bool = True) -> Iterator[list[Partition]]:
    """The run's chunks as `count` partitions by request (default: from its size); temporary files are
    removed on exit."""
    parts = chunk_parts(run_dir)
    n = count or partition_count(chunk_rows(run_dir), ROWS_PER_PARTITION)
    if n == 1 or not parts:
        yield [Partition(run_dir=Path(run_dir))]
        return
    tmp = Path(tempfile.mkdtemp(prefix="itlbench-chunks-"))
    try:
        yield [Partition(files=f, index=i, count=n) for i, f in enumerate(_split(parts, n, tmp, streaming))]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def by_partition(rows: pl.DataFrame, count: int) -> list[pl.DataFrame]:
    """A table keyed by request_id split as the chunks are (same hash), hashed once: joining each
    partition's chunks with only its own requests keeps the work per partition from growing with the
    whole run's request count."""
    if count == 1:
        return [rows]
    split = rows.with_columns(_key(count)).partition_by(KEY, as_dict=True, include_key=False)
    empty = rows.clear()
    return [split.get((i,), empty) for i in range(count)]


class Partition:
    """One piece of the chunks table: whole requests only."""

    def __init__(self, files: list[Path] | None = None, run_dir: Path | None = None, index: int = 0,
                 count: int = 1) -> None:
        self.files = files or []
        self.run_dir = run_dir
        self.index, self.count = index, count

    def release(self) -> None:
        """Delete this partition's temporary files once read (the disk a large run needs then shrinks
        as the analysis goes, from ~70 bytes per chunk row at the start)."""
        for f in self.files:
            f.unlink(missing_ok=True)

    def read(self) -> pl.DataFrame:
        if self.run_dir is not None:
            return read_table(self.run_dir, "chunks")
        if not self.files:
            return pl.DataFrame(schema=CHUNK_SCHEMA)
        return conform(pl.concat([pl.read_ipc(f) for f in self.files]), CHUNK_SCHEMA)
