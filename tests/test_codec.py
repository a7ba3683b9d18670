import math

import pyarrow as pa
import pytest

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES, SCHEMA_VERSION, ColType


def sample_row(rt, i=0):
    row = {}
    for c in rt.columns:
        if c.type in (ColType.STRING, ColType.SYMBOL):
            row[c.name] = f"{c.name}-{i}"
        elif c.type == ColType.BOOL:
            row[c.name] = bool(i % 2)
        elif c.type == ColType.FLOAT64:
            row[c.name] = 0.5 + i
        else:
            row[c.name] = 1_700_000_000_000_000_000 + i if c.name.endswith("_ns") else i
    return row


@pytest.mark.parametrize("name", sorted(RECORD_TYPES))
def test_arrow_and_json_roundtrip_every_record_type(name):
    rt = RECORD_TYPES[name]
    rows = [sample_row(rt, i) for i in range(5)]
    decoded = codec.decode_batch(codec.encode_batch({name: rows}))
    assert decoded[name].to_pylist() == codec.rows_to_table(rt, rows).to_pylist()
    decoded_json = codec.decode_json(codec.encode_json({name: rows}))
    assert decoded_json[name].to_pylist() == decoded[name].to_pylist()
    assert decoded[name].schema.metadata[b"fleetscope.schema_version"] == str(SCHEMA_VERSION).encode()


def test_defaults_fill_optional_columns_and_nan_survives_json():
    rows = [{"job": "j", "rank": 0, "step": 1, "start_ns": 1, "end_ns": 2, "duration_ns": 1}]
    t = codec.decode_json(codec.encode_json({"steps": rows}))["steps"]
    assert t.column("attempt").to_pylist() == [0]
    assert math.isnan(t.column("loss")[0].as_py())


@pytest.mark.parametrize(
    "doc,msg",
    [
        ({"records": {"nope": []}}, "unknown record type 'nope'"),
        ({"records": {"steps": [{"job": "j"}]}}, r"steps\[0\]: missing required field 'rank'"),
        ({"records": {"steps": [{"job": 1, "rank": 0}]}}, r"steps\[0\].job: expected a string"),
        ({"records": {"metrics": [dict(ts_ns=1, host="h", source="gpu", name="x", value="hot")]}}, "expected a number"),
        ({"records": {"steps": [{"bogus": 1}]}}, "unknown field"),
        ({"schema_version": 99, "records": {}}, "schema_version 99"),
        ([], "expected an object"),
    ],
)
def test_json_errors_name_the_problem(doc, msg):
    import json

    with pytest.raises(codec.BatchError, match=msg):
        codec.decode_json(json.dumps(doc))


def test_arrow_errors_name_the_problem():
    good = codec.encode_batch({"steps": [sample_row(RECORD_TYPES["steps"])]})
    with pytest.raises(codec.BatchError, match="truncated"):
        codec.decode_batch(good[:-10])
    with pytest.raises(codec.BatchError, match="bad frame header"):
        codec.decode_batch(b"XXXX" + good[4:])
    bad = pa.table({"job": ["j"], "rank": pa.array([None], pa.int32())},
                   schema=pa.schema([("job", pa.string()), ("rank", pa.int32())],
                                    metadata={b"fleetscope.record": b"steps"}))
    payload = codec.table_to_ipc(bad)
    with pytest.raises(codec.BatchError, match="null"):
        codec.decode_batch(codec.FRAME_MAGIC + codec._LEN.pack(len(payload)) + payload)


def test_conform_casts_compatible_types_and_dictionary_strings():
    rt = RECORD_TYPES["metrics"]
    t = pa.table({
        "ts_ns": pa.array([1], pa.int32()),
        "host": pa.array(["h"]).dictionary_encode(),
        "source": ["gpu"], "name": ["gpu.util"], "value": pa.array([3], pa.int64()),
    })
    out = codec.conform(rt, t)
    assert out.schema.equals(rt.arrow_schema(), check_metadata=False)
    assert out.column("value").to_pylist() == [3.0]
    assert out.column("rank").to_pylist() == [-1]


def test_conform_limits_and_inf_see_every_chunk_and_slice():
    """The string-length limit and the ±inf rewrite read sliced, multi-chunk columns
    right (offsets of a slice start past 0; the offender may sit in any chunk)."""
    rt = RECORD_TYPES["metrics"]
    rows = [sample_row(rt, i) for i in range(6)]
    base = codec.rows_to_table(rt, rows)
    sym = next(c.name for c in rt.columns if c.type == ColType.SYMBOL)
    flt = next(c.name for c in rt.columns if c.type == ColType.FLOAT64)
    lim = codec.Limits(max_symbol_bytes=10)
    long_sym = "x" * 11
    vals = [f"s{i}" for i in range(6)]
    vals[4] = long_sym
    col = pa.chunked_array([pa.array(vals[:3]), pa.array(vals).slice(3, 3)])
    bad = base.set_column(base.schema.get_field_index(sym), sym, col)
    with pytest.raises(codec.BatchError, match=rf"metrics\[4\]\.{sym}: 11 bytes, more than max_symbol_bytes=10"):
        codec.conform(rt, bad, lim)
    # the same values minus the long one, sliced past it: accepted
    ok = base.set_column(base.schema.get_field_index(sym), sym,
                         pa.chunked_array([pa.array(vals[:3]), pa.array(vals).slice(5, 1), pa.array(vals[:2])]))
    assert codec.conform(rt, ok, lim).num_rows == 6
    f = pa.chunked_array([pa.array([1.0, 2.0, 3.0]), pa.array([0.0, 4.0, math.inf, -math.inf]).slice(1, 3)])
    out = codec.conform(rt, base.set_column(base.schema.get_field_index(flt), flt, f))
    got = out[flt].to_pylist()
    assert got[:4] == [1.0, 2.0, 3.0, 4.0] and math.isnan(got[4]) and math.isnan(got[5])
