"""Reading a run directory: one sub-directory of parquet part files per table."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from itlbench.analysis.records import TABLES, empty


def conform(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Exactly the schema's columns and types: missing columns null, extra ones dropped."""
    return df.select(
        (pl.col(name).cast(dtype) if name in df.columns else pl.lit(None, dtype=dtype)).alias(name)
        for name, dtype in schema.items()
    )


def read_table(run_dir: str | Path, table: str) -> pl.DataFrame:
    """All part files of one table, or an empty frame of its schema when there are none."""
    parts = sorted(Path(run_dir, table).glob("*.parquet"))
    frames = [conform(pl.read_parquet(p), TABLES[table]) for p in parts]
    frames = [f for f in frames if f.height]
    return pl.concat(frames) if frames else empty(table)


def load_tables(run_dir: str | Path) -> dict[str, pl.DataFrame]:
    return {table: read_table(run_dir, table) for table in TABLES}
