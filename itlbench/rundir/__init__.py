"""The run directory: one definition of its tables (`schema`), its writer (`store.RunStore`) and its
readers (`reader`). It sits below `load/` (which writes runs) and `analysis/` and `report/` (which
read them), so none of those imports another to reach a record type.

    <run>/run.json          configuration, versions, hardware, engine, measurement window
    <run>/summary.json      headline figures under stable keys (itlbench.analysis.summary)
    <run>/<table>/part-NNNNN.parquet   one folder per table in schema.TABLES, flushed as the run goes
    <run>/server.log        the bundled engine server's log
"""

from itlbench.rundir.reader import load_tables, read_run_doc, read_summary, read_table, unreadable_parts
from itlbench.rundir.schema import TABLES, empty, frame
from itlbench.rundir.store import RunStore

RUN_DOC = "run.json"
SUMMARY = "summary.json"
SERVER_LOG = "server.log"

__all__ = ["RUN_DOC", "SERVER_LOG", "SUMMARY", "TABLES", "RunStore", "empty", "frame", "load_tables",
           "read_run_doc", "read_summary", "read_table", "unreadable_parts"]
