"""Compaction of a finished run directory's parts: an hour-long run flushes a part per table every
2 s (RunStore), ~1,800 small files per table; compacted, each table is a few files of up to
`TARGET_ROWS` rows, in the same row order, which every reader reads faster (one footer and one
open per file instead of thousands).

Crash-safe: each compacted file is written aside (`.compact-*.parquet.tmp`, which the readers'
`*.parquet` glob skips), a journal (`<table>/.compact.json`) names it and the parts it holds, an atomic rename puts it in place of
the first of them, and the others are deleted. A crash leaves either the parts intact (the aside file
still exists) or the merged file plus parts it already holds; `recover` (run first by every
compaction) tells the two apart by the aside file and finishes or undoes the step. Only in the
moment between the rename and the deletions could a reader see rows twice, and only if it crashed
there and nothing compacts the run again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from itlbench.errors import ConfigError
from itlbench.rundir.reader import conform, readable
from itlbench.rundir.schema import TABLES

TARGET_ROWS = 2_000_000
JOURNAL = ".compact.json"


@dataclass(frozen=True)
class Compacted:
    """One table's compaction: parts before and after, rows (unchanged)."""

    table: str
    parts_before: int
    parts_after: int
    rows: int


def _parts(folder: Path) -> list[Path]:
    """The parts to merge: one whose footer does not read stays as it is (the readers leave it out)."""
    return [p for p in sorted(folder.glob("part-*.parquet")) if readable(p)]


def _groups(parts: list[Path], target_rows: int) -> list[list[tuple[Path, int]]]:
    """Consecutive parts grouped up to target_rows rows each (a part larger than that stays alone)."""
    groups: list[list[tuple[Path, int]]] = [[]]
    rows = 0
    for p in parts:
        n = int(pl.scan_parquet(p).select(pl.len()).collect().item())  # from the footer
        if groups[-1] and rows + n > target_rows:
            groups.append([])
            rows = 0
        groups[-1].append((p, n))
        rows += n
    return [g for g in groups if g]


def recover(folder: Path) -> None:
    """Finish an interrupted compaction. The file written aside still there: the rename never happened
    and the parts are intact, so drop it; gone: the first part now holds the group, so delete the rest."""
    journal = folder / JOURNAL
    if journal.is_file():
        entry = json.loads(journal.read_text())
        aside = folder / entry["aside"]
        if aside.is_file():
            aside.unlink()
        else:
            for name in entry["subsumed"]:
                (folder / name).unlink(missing_ok=True)
        journal.unlink()
    for stray in folder.glob(".compact-*.parquet.tmp"):  # written aside, crashed before its journal
        stray.unlink()


def compact_table(run_dir: str | Path, table: str, target_rows: int = TARGET_ROWS) -> Compacted:
    """Merge one table's parts into files of up to target_rows rows (row order kept)."""
    folder = Path(run_dir, table)
    recover(folder)
    parts = _parts(folder)
    before, rows = len(parts), 0
    for group in _groups(parts, target_rows):
        rows += sum(n for _, n in group)
        if len(group) == 1:
            continue
        first = group[0][0]
        merged = pl.concat([conform(pl.read_parquet(p), TABLES[table]) for p, _ in group])
        aside = folder / f".compact-{first.stem}.parquet.tmp"
        merged.write_parquet(aside)
        journal = folder / JOURNAL
        journal.write_text(json.dumps({"into": first.name, "aside": aside.name,
                                       "subsumed": [p.name for p, _ in group[1:]]}))
        os.replace(aside, first)
        for p, _ in group[1:]:
            p.unlink()
        journal.unlink()
    return Compacted(table, before, len(_parts(folder)), rows)


def compact_run(run_dir: str | Path, target_rows: int = TARGET_ROWS) -> list[Compacted]:
    """Compact every table of a finished run (never while its RunStore still writes: it would number a
    new part after the compacted ones, which is harmless, but a part being replaced could be read twice)."""
    root = Path(run_dir)
    if not (root / "run.json").is_file():
        raise ConfigError("RUN_DIR", f"{root} has no run.json", "pass a directory written by `itlbench run`")
    return [compact_table(root, t, target_rows) for t in TABLES if (root / t).is_dir()]
