"""Odd and hostile trace files: each is replayed as meant, or refused in one line naming the line and the fix."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from itlbench.errors import ConfigError
from itlbench.workloads import load_trace

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_trace(path)
    message = str(err.value)
    assert err.value.field == "--trace" and "\n" not in message and err.value.fix
    for needle in needles:
        assert needle in message, message
    return message


@pytest.mark.parametrize(("name", "text", "line", "cell"), [
    ("burst.csv", BURST + "0,m,10,10,20,x\nnan,m,10,10,20,x\n", "line 3", "'nan'"),
    ("burst_inf.csv", BURST + "0,m,10,10,20,x\ninf,m,10,10,20,x\n", "line 3", "'inf'"),
    ("moon_nan.jsonl", '{"timestamp": NaN, "input_length": 9, "output_length": 9}\n', "line 1", "NaN"),
    ("moon_inf.jsonl", '{"timestamp": 0, "input_length": 9, "output_length": 9}\n'
                       '{"timestamp": Infinity, "input_length": 9, "output_length": 9}\n', "line 2", "Infinity"),
])
def test_a_non_finite_timestamp_is_refused_with_its_line(tmp_path: Path, name: str, text: str, line: str,
                                                        cell: str) -> None:
    # was: a NaN offset reached the driver (ValueError: cannot convert float NaN to integer, a traceback)
    _refused(_write(tmp_path, name, text), line, cell, "finite")


def test_time_zones_are_read_and_taken_to_utc(tmp_path: Path) -> None:
    # a trace across a clock change: 01:59:30+01:00 then 01:00:10+00:00 is 40 s later, not an hour earlier
    path = _write(tmp_path, "tz.csv", AZURE + "2023-10-29 01:59:30.5+01:00,10,5\n2023-10-29T01:00:10.5Z,20,6\n"
                  "2023-10-29 01:00:12.5+0000,30,7\n")
    trace = load_trace(path)
    np.testing.assert_allclose(trace.offsets_s, [0.0, 40.0, 42.0])
    assert trace.prompt_tokens.tolist() == [10, 20, 30]
    naive_t = _write(tmp_path, "iso.csv", AZURE + "2023-11-16T18:15:46.5,10,5\n2023-11-16T18:15:47,10,5\n")
    np.testing.assert_allclose(load_trace(naive_t).offsets_s, [0.0, 0.5])


def test_a_mix_of_zoned_and_unzoned_times_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "mixed.csv", AZURE + "2023-11-16 18:15:46,10,5\n2023-11-16 18:15:47+01:00,10,5\n")
    _refused(path, "line 3", "time zone", "line 2")


def test_bom_crlf_and_gzip_are_read_in_every_format(tmp_path: Path) -> None:
    moon = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\r\n' \
           '{"timestamp": 250, "input_length": 700, "output_length": 6, "hash_ids": [1, 3]}\r\n'
    azure = AZURE.replace("\n", "\r\n") + "2023-11-16 18:15:46.0,600,5\r\n2023-11-16 18:15:46.25,700,6\r\n"
    for name, text in (("m.jsonl", moon), ("a.csv", azure)):
        bom = b"\xef\xbb\xbf" + text.encode()
        for variant, data in ((name, bom), (name + ".gz", gzip.compress(bom))):
            trace = load_trace(_write(tmp_path, variant, data))
            assert trace.prompt_tokens.tolist() == [600, 700], variant
            np.testing.assert_allclose(trace.offsets_s, [0.0, 0.25])
            assert trace.format == ("mooncake" if name.endswith("jsonl") else "azure")
    # was: a BOM or gzip hid the JSONL's '{' and it was read as a CSV lacking TIMESTAMP
    assert load_trace(tmp_path / "m.jsonl.gz").blocks == ((1, 2), (1, 3))


@pytest.mark.parametrize(("record", "needle"), [
    ({"input_length": 100.7}, "input_length is 100.7"),
    ({"input_length": True}, "input_length is true"),
    ({"output_length": "many"}, 'output_length is "many"'),
    ({"hash_ids": [1, "x"]}, "hash_ids is"),
    ({"hash_ids": 7}, "hash_ids is 7"),
])
def test_a_mooncake_value_that_is_no_token_count_is_refused(tmp_path: Path, record: dict, needle: str) -> None:
    # was: 100.7 truncated to 100 and true read as 1 token, silently
    good = {"timestamp": 0, "input_length": 100, "output_length": 10}
    path = _write(tmp_path, "m.jsonl", json.dumps(good) + "\n" + json.dumps({**good, **record}) + "\n")
    _refused(path, "line 2", needle)


def test_csv_values_are_refused_with_their_line_and_whole_floats_taken(tmp_path: Path) -> None:
    _refused(_write(tmp_path, "a.csv", AZURE + "2023-11-16 18:15:46,10,5\n2023-11-16 18:15:47,ten,5\n"),
             "line 3", "ContextTokens is 'ten'")
    _refused(_write(tmp_path, "b.csv", AZURE + "2023-11-16 18:15:46,10,5\n2023-11-16 18:15:47,10,5.5\n"),
             "line 3", "GeneratedTokens is '5.5'")
    _refused(_write(tmp_path, "c.csv", AZURE + "2023-11-16 18:15:46,10,5\n,10,5\n"), "line 3", "TIMESTAMP is empty")
    # pandas writes an integer column with gaps as floats: 472.0 is 472 tokens
    pandas = _write(tmp_path, "d.csv", BURST + "0.0,m,472.0,18.0,490.0,x\n1.5,m,1e3,,0,x\n")
    trace = load_trace(pandas)
    assert trace.prompt_tokens.tolist() == [472] and trace.invalid_rows == 1


def test_blank_lines_are_not_rows_and_lines_count_them(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", AZURE + "2023-11-16 18:15:46,10,5\n\n2023-11-16 18:15:45,10,5\n\n")
    _refused(path, "not sorted by TIMESTAMP", "line 4", "line 2")
    ok = _write(tmp_path, "b.csv", AZURE + "2023-11-16 18:15:46,10,5\n\n2023-11-16 18:15:47,10,5\n\n")
    trace = load_trace(ok)
    assert len(trace) == 2 and trace.invalid_rows == 0


def test_unsorted_names_the_format_s_own_column(tmp_path: Path) -> None:
    _refused(_write(tmp_path, "b.csv", BURST + "5,m,10,10,20,x\n3,m,10,10,20,x\n"), "sorted by Timestamp", "line 3")
    moon = '{"timestamp": 9, "input_length": 9, "output_length": 9}\n\n' \
           '{"timestamp": 1, "input_length": 9, "output_length": 9}\n'
    _refused(_write(tmp_path, "m.jsonl", moon), "sorted by timestamp", "line 3", "line 1")


@pytest.mark.parametrize("text", [b"", b"\n\n", b"\xef\xbb\xbf", gzip.compress(b"")])
def test_an_empty_file_is_refused_with_the_formats(tmp_path: Path, text: bytes) -> None:
    _refused(_write(tmp_path, "t.csv", text), "is empty", "Mooncake")


def test_a_mooncake_line_nested_past_the_parser_s_stack_is_refused_with_its_line(tmp_path: Path) -> None:
    # was: RecursionError, a traceback and exit 1
    good = '{"timestamp": 0, "input_length": 9, "output_length": 9}\n'
    deep = '{"timestamp": 1, "input_length": 9, "output_length": 9, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    _refused(_write(tmp_path, "m.jsonl", good + deep), "line 2", "nested too deeply")


def test_timestamps_centuries_apart_are_refused_as_such_not_as_unsorted(tmp_path: Path) -> None:
    # was: 1700 then 2200 overflowed the nanosecond difference and the later row was called 2.7e9 s earlier
    path = _write(tmp_path, "years.csv", AZURE + "1700-01-01 00:00:00,10,5\n2200-01-01 00:00:00,10,5\n")
    message = _refused(path, "line 3", "years after line 2")
    assert "sorted" not in message
    # a century is still read
    ok = _write(tmp_path, "century.csv", AZURE + "1950-01-01 00:00:00,10,5\n2050-01-01 00:00:00,10,5\n")
    assert load_trace(ok).offsets_s[1] == 36_525 * 86_400
