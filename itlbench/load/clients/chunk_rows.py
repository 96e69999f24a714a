"""Chunk rows of one request, built column-wise from the times and counts a stream client keeps.

Every chunk completed by one network read gets that read's stamp, so chunks of a request sharing a
`t_ns` came in one read: `read_chunks` says how many (1 = alone). Of several, only the last was
stamped when its own bytes arrived; the earlier ones carry a later time than their arrival, and
their gaps read 0 ms next to one long gap (what a busy client or a batching server produces).
"""

from __future__ import annotations

from itertools import islice
from operator import eq, ne
from typing import Any


def settled_end(times: list[int], start: int, final: bool) -> int:
    """End of the rows that can be written now: all when `final`, else all but the newest read's
    (more chunks of that read may still follow, and they must share one `read_chunks` count)."""
    end = len(times)
    if not final and end > start:
        last = times[-1]
        while end > start and times[end - 1] == last:
            end -= 1
    return end


def read_counts(times: list[int]) -> list[int]:
    """Per chunk: how many chunks of the slice share its stamp (stamps of one request only grow, so
    chunks of one read are neighbours)."""
    n = len(times)
    same = list(map(eq, times, islice(times, 1, None)))  # same[i]: chunk i+1 shares chunk i's read
    if True not in same:
        return [1] * n
    out = [1] * n
    i = same.index(True)
    while True:
        j = i
        while j < n - 1 and same[j]:
            j += 1
        out[i:j + 1] = [j + 1 - i] * (j + 1 - i)
        try:
            i = same.index(True, j)
        except ValueError:
            return out


def chunk_columns(request_id: str, times: list[int], counts: list[int], read_times: list[int] | None,
                  start: int, end: int) -> dict[str, list[Any]]:
    """Rows [start, end) as columns. `read_times` None: user-space stamps (t_ns is the read time);
    else the user-space time of each chunk's read, beside a kernel stamp in `times` (a chunk whose
    read carried no kernel stamp has t_ns == t_read_ns and is marked "user")."""
    t = times[start:end]
    n = len(t)
    if read_times is None:
        tr, stamp = t, ["user"] * n
    else:
        tr = read_times[start:end]
        stamp = (["kernel"] * n if all(map(ne, t, tr)) else
                 ["kernel" if a != b else "user" for a, b in zip(t, tr, strict=True)])
    return {"request_id": [request_id] * n, "index": list(range(start, end)), "t_ns": t,
            "n_tokens": counts[start:end], "stamp": stamp, "t_read_ns": tr, "read_chunks": read_counts(t)}


def hand_over(sink: Any, columns: dict[str, list[Any]]) -> None:
    """Columns to a sink that takes them; row dicts to one that takes only rows."""
    add_columns = getattr(sink, "add_columns", None)
    if add_columns is not None:
        add_columns("chunks", columns)
        return
    names = list(columns)
    for values in zip(*columns.values(), strict=True):
        sink.add("chunks", dict(zip(names, values, strict=True)))
