"""Reading a run directory: one sub-directory of parquet part files per table, plus JSON documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from itlbench.errors import ConfigError, ItlbenchError
from itlbench.rundir.schema import TABLES, empty


def conform(df: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Exactly the schema's columns and types: missing columns null, extra ones dropped. A column of a part
    that itlbench did not write as it writes it (text in a time column, a list for a status, a float no int64
    holds) is coerced as the writers coerce an untrusted peer's rows: a cell that cannot be made the column's
    type is null, and a column no cell of which can, all null (a strict cast was a traceback, the run unread)."""
    try:
        return df.select(
            (pl.col(name).cast(dtype) if name in df.columns else pl.lit(None, dtype=dtype)).alias(name)
            for name, dtype in schema.items()
        )
    except pl.exceptions.PolarsError:
        return pl.DataFrame([_column(df, name, dtype) for name, dtype in schema.items()])


def _column(df: pl.DataFrame, name: str, dtype: pl.DataType) -> pl.Series:
    if name in df.columns:
        try:
            return df[name].cast(dtype, strict=False)
        except pl.exceptions.PolarsError:  # no cast between the kinds at all (a list as text)
            pass
    return pl.Series(name, [None] * df.height, dtype=dtype)


WORKER_PART_BASE = 90000  # a worker's parts, merged, become part-<90000+k> (load.multiproc.MERGED_PART_BASE)


def readable(part: Path) -> bool:
    """The part's footer reads: a file cut short (a full disk, a copy interrupted, a crash while the
    kernel still held its pages) has none, and is left out rather than losing the run's other records."""
    try:
        pl.read_parquet_schema(part)
    except (pl.exceptions.PolarsError, OSError):
        return False
    return True


def _all_parts(run_dir: str | Path, table: str) -> list[Path]:
    parts = sorted(Path(run_dir, table).glob("*.parquet"))
    names = {p.name for p in parts}
    for wdir in sorted(Path(run_dir, "workers").glob("*")):
        if wdir.name.isdigit() and f"part-{WORKER_PART_BASE + int(wdir.name):05d}.parquet" not in names:
            parts += sorted((wdir / table).glob("part-*.parquet"))
    return parts


def table_parts(run_dir: str | Path, table: str) -> list[Path]:
    """The readable part files of one table: the run's own, and those still in `workers/<k>/` of a run
    killed before it merged them (a worker whose merged part exists is not read twice)."""
    return [p for p in _all_parts(run_dir, table) if readable(p)]


def unreadable_parts(run_dir: str | Path) -> list[str]:
    """Part files, relative to the run directory, that `table_parts` leaves out: the summary names them."""
    root = Path(run_dir)
    return [str(p.relative_to(root)) for table in TABLES for p in _all_parts(root, table) if not readable(p)]


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
    except RecursionError:  # arrays in arrays, thousands deep: json's decoder recurses
        raise ItlbenchError(f"{path} is not valid JSON (nested deeper than Python's parser goes): {fix}") from None
    if not isinstance(doc, dict):
        raise ItlbenchError(f"{path} is not a JSON object: {fix}")
    return doc


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object's members, or none where the file is missing or does not read (refused where it is read)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _recorded(run_dir: Path) -> tuple[str, dict[str, str]]:
    """What each table held when the run ended, and which document says so: run.json's compaction (rows),
    else summary.json's request count (a run kept without its records, as the committed examples are)."""
    compaction = _json_object(run_dir / "run.json").get("compaction")
    if isinstance(compaction, dict):
        return "run.json", {t: f"{c['rows']:,} rows" for t, c in compaction.items()
                            if t in TABLES and isinstance(c, dict) and isinstance(c.get("rows"), int) and c["rows"] > 0}
    total = (_json_object(run_dir / "summary.json").get("requests") or {}).get("total")
    return "summary.json", {"requests": f"{total:,} requests"} if isinstance(total, int) and total > 0 else {}


def require_records(run_dir: str | Path, flag: str = "RUN_DIR") -> None:
    """Refuse a run whose records are gone, every part file of a table deleted, moved or never copied: read as
    empty, they would make a summary and report of a run that measured nothing (and overwrite the real ones)."""
    source, counted = _recorded(Path(run_dir))
    gone = [f"{table}/ ({what})" for table, what in counted.items() if not _all_parts(run_dir, table)]
    if gone:
        raise ConfigError(flag, f"{run_dir} lacks the part files {source} counts: {', '.join(gone)}",
                          "restore them from a copy of the run directory, or run it again; without them it reads "
                          "as a run that measured nothing")
    # Every part there but none whose footer reads (a copy cut short): read as empty, the same run of nothing.
    parts = {table: _all_parts(run_dir, table) for table in counted}
    cut = [f"{table}/ ({what}: {', '.join(p.name for p in parts[table][:3])}{' …' if len(parts[table]) > 3 else ''})"
           for table, what in counted.items() if not any(readable(p) for p in parts[table])]
    if cut:
        raise ConfigError(flag, f"{run_dir} has no readable part file of a table {source} counts, each cut short on "
                          f"disk: {', '.join(cut)}", "restore them from a copy of the run directory, or run it "
                          "again; read without them it is a run that measured nothing")


# The document each command writes into its directory, and what that makes the directory.
RECORD_DOCS = {"run.json": "a run", "sweep.json": "a sweep", "capacity.json": "a capacity search",
               "phases.json": "a phases study", "compare.json": "a comparison"}


def not_a_run(path: str | Path, flag: str = "RUN_DIR") -> ConfigError:
    """The error for a path without run.json, pointing into a sweep's or capacity search's directory (whose
    runs are one level down, and whose own report is its report.html) rather than only refusing it."""
    root = Path(path)
    if not root.exists():
        return ConfigError(flag, f"{root} does not exist", "pass a directory written by `itlbench run`")
    if not root.is_dir():
        inside = root.name in RECORD_DOCS or root.name.startswith("summary")  # the run's own file, not its directory
        return ConfigError(flag, f"{root} is a file, not a run directory",
                           f"pass the directory that holds it, {root.parent}" if inside
                           else "pass a directory written by `itlbench run`")
    kind = next((what for name, what in RECORD_DOCS.items() if name != "run.json" and (root / name).is_file()), None)
    if kind is None:
        return ConfigError(flag, f"{root} has no run.json", "pass a directory written by `itlbench run`")
    runs = sorted(str(p.parent) for p in root.glob("*/run.json")) or sorted(str(p.parent) for p in root.glob("*/*/run.json"))
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    where = f"its runs are {shown}" if runs else "it holds no run"
    return ConfigError(flag, f"{root} is {kind}, not a run", f"{where}; its own report is {root / 'report.html'}")


def read_run_doc(run_dir: str | Path) -> dict[str, Any]:
    """run.json: configuration, versions, hardware, engine and the measurement window."""
    return _read_json(run_dir, "run.json", "not a run directory written by `itlbench run`")


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """summary.json: the headline figures (recompute with `itlbench analyze RUN_DIR`)."""
    return _read_json(run_dir, "summary.json", f"run `itlbench analyze {run_dir}` to compute it")
