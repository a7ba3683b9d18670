"""Property tests for the wire codec (:mod:`fleetscope.codec`): whatever the bytes, the
Arrow and JSON decoders either return canonical tables within the limits or raise the
module's own :class:`~fleetscope.codec.BatchError`; never anything else.

Iterations per decoder: ``FUZZ_EXAMPLES`` (env ``FLEETSCOPE_FUZZ_EXAMPLES``) for each of
the mutation strategies below.
"""

from __future__ import annotations

import json
import os
import struct

import pyarrow as pa
from fleetscope.collector.validate import decode_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.data import sample_batch, sample_rows

FUZZ_EXAMPLES = int(os.environ.get("FLEETSCOPE_FUZZ_EXAMPLES", "300"))
LIMITS = codec.Limits(max_decoded_bytes=8 << 20, max_rows=20_000, max_string_bytes=4096, max_symbol_bytes=200)
SETTINGS = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip

_BATCH = sample_batch(3, job="fz")
SEEDS_ARROW = [
    codec.encode_batch(_BATCH),
    codec.encode_batch({"log_events": sample_rows("log_events", 5)}, compression=None),
    codec.encode_batch({"metrics": sample_rows("metrics", 50)}, compression="lz4"),
]
# one with a dictionary-encoded string column (the expansion path)
_t = codec.rows_to_table(RECORD_TYPES["log_events"], sample_rows("log_events", 6))
_i = _t.schema.get_field_index("kind")
_t = _t.set_column(_i, pa.field("kind", pa.dictionary(pa.int32(), pa.string()), nullable=False),
                   _t["kind"].dictionary_encode())  # fmt: skip
_payload = codec.table_to_ipc(_t)
SEEDS_ARROW.append(codec.FRAME_MAGIC + struct.pack("<I", len(_payload)) + _payload)
SEEDS_JSON = [codec.encode_json(_BATCH), codec.encode_json({"steps": sample_rows("steps", 4)})]


def _check_decoded(out: dict[str, pa.Table]) -> None:
    assert set(out) <= set(RECORD_TYPES)
    rows = 0
    for name, table in out.items():
        assert table.schema.equals(RECORD_TYPES[name].arrow_schema(), check_metadata=True)
        table.validate(full=True)
        rows += table.num_rows
    assert rows <= LIMITS.max_rows


def _mutate(data: bytes, edits: list[tuple[int, int, int]], cut: int | None) -> bytes:
    """Apply (position, kind, byte) edits: 0 overwrite, 1 insert, 2 delete; then truncate."""
    b = bytearray(data)
    for pos, kind, val in edits:
        if not b:
            break
        pos %= len(b)
        if kind == 0:
            b[pos] = val
        elif kind == 1:
            b.insert(pos, val)
        else:
            del b[pos]
    if cut is not None and b:
        del b[cut % len(b) :]
    return bytes(b)


EDITS = st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 2), st.integers(0, 255)), min_size=1, max_size=8)


def _arrow(data: bytes) -> None:
    try:
        out = codec.decode_batch(data, LIMITS)
    except codec.BatchError:
        return
    _check_decoded(out)


def _json(data: bytes) -> None:
    try:
        out = codec.decode_json(data, LIMITS)
    except codec.BatchError:
        return
    _check_decoded(out)


@SETTINGS
@given(seed=st.sampled_from(SEEDS_ARROW), edits=EDITS, cut=st.none() | st.integers(0, 2**20))
def test_arrow_mutated_bytes_give_only_batch_error(seed, edits, cut):
    _arrow(_mutate(seed, edits, cut))


@SETTINGS
@given(seed=st.sampled_from(SEEDS_ARROW), edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)),
                                                          min_size=1, max_size=6))  # fmt: skip
def test_arrow_mutated_metadata_region_gives_only_batch_error(seed, edits):
    """Edits concentrated on the frame header and the IPC schema / message metadata."""
    b = bytearray(seed)
    for pos, val in edits:
        b[pos % min(len(b), 400)] = val
    _arrow(bytes(b))


@SETTINGS
@given(data=st.binary(max_size=4096))
def test_arrow_random_bytes_behind_a_valid_frame_header(data):
    _arrow(codec.FRAME_MAGIC + struct.pack("<I", len(data)) + data)


@SETTINGS
@given(seed=st.sampled_from(SEEDS_JSON), edits=EDITS, cut=st.none() | st.integers(0, 2**20))
def test_json_mutated_bytes_give_only_batch_error(seed, edits, cut):
    _json(_mutate(seed, edits, cut))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@SETTINGS
@given(record=st.sampled_from(sorted(RECORD_TYPES)), field=st.text(max_size=12), value=JSON_VALUES,
       replace=st.booleans())  # fmt: skip
def test_json_structured_values_give_only_batch_error(record, field, value, replace):
    """Any JSON value in any field (known or not) of any record type."""
    row = sample_rows(record, 1)[0]
    if replace and row:
        field = sorted(row)[len(field) % len(row)]
    row[field] = value
    try:
        body = json.dumps({"schema_version": 1, "records": {record: [row]}}).encode()
    except (ValueError, TypeError):
        return
    _json(body)


@SETTINGS
@given(body=st.binary(max_size=2048), ctype=st.sampled_from([codec.ARROW_CONTENT_TYPE, codec.JSON_CONTENT_TYPE]),
       offset=st.integers(-(2**62), 2**62))  # fmt: skip
def test_decode_request_gives_only_batch_error(body, ctype, offset):
    """The collector's whole decode + value checks + clock shift."""
    try:
        decode_request(body, ctype, "h", offset)
    except codec.BatchError:
        pass


def test_seeds_decode():
    for s in SEEDS_ARROW:
        _check_decoded(codec.decode_batch(s, LIMITS))
    for s in SEEDS_JSON:
        _check_decoded(codec.decode_json(s, LIMITS))
