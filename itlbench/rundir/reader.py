"""Reading a run directory: one sub-directory of parquet part files per table, plus JSON documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.errors import ItlbenchError
from itlbench.rundir.schema import TABLES, empty


def conform(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Exactly the schema's columns and types: missing columns null, extra ones dropped."""
    return df.select(
        (pl.col(name).cast(dtype) if name in df.columns else pl.lit(None, dtype=dtype)).alias(name)
        for name, dtype in schema.items()
    )


WORKER_PART_BASE = 90000  # a worker's parts, merged, become part-<90000+k> (load.multiproc.MERGED_PART_BASE)


def table_parts(run_dir: str | Path, table: str) -> list[Path]:
    """The part files of one table: the run's own, and those still in `workers/<k>/` of a run killed
    before it merged them (a worker whose merged part exists is not read twice)."""
    parts = sorted(Path(run_dir, table).glob("*.parquet"))
    names = {p.name for p in parts}
    for wdir in sorted(Path(run_dir, "workers").glob("*")):
        if wdir.name.isdigit() and f"part-{WORKER_PART_BASE + int(wdir.name):05d}.parquet" not in names:
            parts += sorted((wdir / table).glob("part-*.parquet"))
    return parts


def read_table(run_dir: str | Path, table: str) -> pl.DataFrame:
    """All part files of one table (`table_parts`), or an empty frame of its schema when there are none."""
    parts = table_parts(run_dir, table)
    frames = [conform(pl.read_parquet(p), TABLES[table]) for p in parts]
    frames = [f for f in frames if f.height]
    return pl.concat(frames) if frames else empty(table)


def load_tables(run_dir: str | Path) -> dict[str, pl.DataFrame]:
    return {table: read_table(run_dir, table) for table in TABLES}


def _read_json(run_dir: str | Path, name: str, fix: str) -> dict[str, Any]:
    path = Path(run_dir) / name
    if not path.is_file():
        raise ItlbenchError(f"{run_dir} has no {name}: {fix}")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ItlbenchError(f"{path} is not valid JSON ({exc}): {fix}") from None
    if not isinstance(doc, dict):
        raise ItlbenchError(f"{path} is not a JSON object: {fix}")
    return doc


def read_run_doc(run_dir: str | Path) -> dict[str, Any]:
    """run.json: configuration, versions, hardware, engine and the measurement window."""
    return _read_json(run_dir, "run.json", "not a run directory written by `itlbench run`")


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """summary.json: the headline figures (recompute with `itlbench analyze RUN_DIR`)."""
    return _read_json(run_dir, "summary.json", f"run `itlbench analyze {run_dir}` to compute it")
