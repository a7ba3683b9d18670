"""The ClickHouse DDL, the Arrow codec and the API models all agree with
``fleetscope.schema`` (the single source of truth)."""

from __future__ import annotations

import pytest
from fleetscope.server.api.models import RECORD_MODELS, JsonRecords
from fleetscope.server.store import Store
from fleetscope.server.store.ddl import BATCH_COLUMN

from fleetscope import codec
from fleetscope.schema import CLICKHOUSE_TYPES, PYTHON_TYPES, RECORD_TYPES, SCHEMA_VERSION


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = Store.open(f"chdb://{tmp_path_factory.mktemp('agree') / 'store'}")
    yield s
    s.close()


@pytest.mark.parametrize("name", sorted(RECORD_TYPES))
def test_ddl_matches_schema(store, name):
    rt = RECORD_TYPES[name]
    cols = store.query_rows(
        "SELECT name, type, is_in_sorting_key AS k FROM system.columns "
        "WHERE database = currentDatabase() AND table = {t:String} ORDER BY position",
        {"t": name},
    )
    assert [(c["name"], c["type"]) for c in cols] == [
        *((c.name, CLICKHOUSE_TYPES[c.type]) for c in rt.columns),
        (BATCH_COLUMN, "LowCardinality(String)"),
    ]
    sorting = store.query_rows(
        "SELECT sorting_key AS s, partition_key AS p, engine FROM system.tables "
        "WHERE database = currentDatabase() AND name = {t:String}",
        {"t": name},
    )[0]
    assert [k.strip() for k in sorting["s"].split(",")] == list(rt.order_by)
    assert rt.time_column in sorting["p"] and sorting["engine"] == "MergeTree"


@pytest.mark.parametrize("name", sorted(RECORD_TYPES))
def test_codec_matches_schema(name):
    rt = RECORD_TYPES[name]
    schema = rt.arrow_schema()
    assert schema.names == list(rt.column_names)
    assert schema.metadata[b"fleetscope.record"] == name.encode()
    assert schema.metadata[b"fleetscope.schema_version"] == str(SCHEMA_VERSION).encode()
    # a defaults-only JSON row decodes to exactly the canonical schema
    row = {c.name: (PYTHON_TYPES[c.type]() if c.required else c.default) for c in rt.columns}
    if "ts_ns" in row or rt.time_column in row:
        row[rt.time_column] = 1_800_000_000 * 10**9
    table = codec.decode_json({"records": {name: [row]}})[name]
    assert table.schema.equals(schema, check_metadata=True)


@pytest.mark.parametrize("name", sorted(RECORD_TYPES))
def test_api_models_match_schema(name):
    rt = RECORD_TYPES[name]
    fields = RECORD_MODELS[name].model_fields
    assert list(fields) == list(rt.column_names)
    for c in rt.columns:
        f = fields[c.name]
        assert f.annotation is PYTHON_TYPES[c.type]
        assert f.is_required() == c.required
    assert name in JsonRecords.model_fields


def test_openapi_documents_every_record_type():
    from fleetscope.server.app import create_app
    from fleetscope.server.settings import Settings

    comps = create_app(Settings(ui=False)).openapi()["components"]["schemas"]
    for name, model in RECORD_MODELS.items():
        props = comps[model.__name__]["properties"]
        assert list(props) == list(RECORD_TYPES[name].column_names)
    assert set(comps["JsonRecords"]["properties"]) == set(RECORD_TYPES)
