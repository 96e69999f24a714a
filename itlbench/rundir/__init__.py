"""The run directory: one definition of its tables (`schema`), its writer (`store.RunStore`) and its
readers (`reader`). It sits below `load/` (which writes runs) and `analysis/` and `report/` (which
read them), so none of those imports another to reach a record type.

    <run>/run.json          configuration, versions, hardware, engine, measurement window
    <run>/summary.json      headline figures under stable keys (itlbench.analysis.summary)
    <run>/<table>/part-NNNNN.parquet   one folder per table in schema.TABLES, flushed as the run goes
    <run>/server.log        the bundled engine server's log
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from itlbench.rundir.reader import load_tables, read_run_doc, read_summary, read_table, unreadable_parts
    from itlbench.rundir.schema import TABLES, empty, frame
    from itlbench.rundir.store import RunStore

RUN_DOC = "run.json"
SUMMARY = "summary.json"
SERVER_LOG = "server.log"

__all__ = ["RUN_DOC", "SERVER_LOG", "SUMMARY", "TABLES", "RunStore", "empty", "frame", "load_tables",
           "read_run_doc", "read_summary", "read_table", "unreadable_parts"]

# Loaded on first use (PEP 562): each of these imports polars, a quarter second that a process which only names
# a directory (`itlbench serve`, `--help`, `rundir.outdir`) never needs.
_LAZY = {"load_tables": "reader", "read_run_doc": "reader", "read_summary": "reader", "read_table": "reader",
         "unreadable_parts": "reader", "TABLES": "schema", "empty": "schema", "frame": "schema", "RunStore": "store"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
