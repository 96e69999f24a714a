"""The comparison on the terminal (and as JSON for --json): one row per run, the verdict, the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from itlbench.report.compare_ci import rows_as_dicts
from itlbench.report.compare_rows import Row
from itlbench.report.style import fmt_s
from itlbench.report.tables import TextTable, print_table


def comparison_doc(rows: list[Row], lines: list[str], html: Path) -> dict[str, Any]:
    """What `print_comparison` shows, for `--json`: compare.json's rows and verdict, and the report."""
    return {"report": str(html), "rows": rows_as_dicts(rows), "verdict": lines}


def print_comparison(console: Console, rows: list[Row], lines: list[str], html: Path) -> None:
    """The comparison table and verdict on the terminal, then where the report is."""
    table = TextTable("Comparison (steady streams)",
                      ("setting", "worst gap", "ITL p99", "p99.9", "TTFT p99", "injected TTFT", "output tok/s",
                       "stall events", "valid"),
                      caption="TTFT p99 over every request, or the worst where too few (under 100); injected TTFT "
                              "the median, or the worst where too few")
    for r in rows:
        table.add_row(r.label, fmt_s(r.worst_s), fmt_s(r.p99_s), fmt_s(r.p999_s), fmt_s(r.ttft_p99_s),
                      fmt_s(r.injected_ttft_s),
                      "—" if r.out_tps is None else f"{r.out_tps:,.0f}", r.stalls_text(),
                      {True: "yes", False: "NO", None: "?"}[r.valid])
    print_table(console, table)
    for line in lines:
        console.print(f"  {line}", highlight=False)
    console.print(f"[bold]Report[/] {html}", highlight=False)
