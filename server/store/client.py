"""The telemetry store: a thin wrapper over clickhouse-connect clients.

The same class serves the embedded engine (chDB, registered by chdb as a
clickhouse-connect backend) and a ClickHouse server over HTTP(S): only the client
construction differs. A chdb client serialises calls on its handle, so the store hands
out separate clients for the ingest writer (:meth:`Store.new_client`) and for queries
(:attr:`Store.client`); both see the same engine.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

import clickhouse_connect
import pyarrow as pa

from .migrations import migrate
from .url import StoreURL, StoreURLError, parse_store_url

log = logging.getLogger(__name__)


NICE_SETTINGS = ("os_threads_nice_value_query", "os_thread_priority")
"""The query-threads nice setting, newest name first (``os_thread_priority`` is the older
name, an alias of the newer one where both exist, e.g. chDB's ClickHouse 26.9)."""


def diagnosis_query_settings(nice: int, store: Store | None = None) -> dict[str, Any]:
    """The settings of the diagnosis passes' queries: the Linux nice value of the
    ClickHouse threads that run them (chDB and a ClickHouse server alike), so that, when
    CPU is short, ingest's inserts and the API's reads go first and a pass waits; with idle
    CPU a pass runs as fast as before. ``nice`` 0: no setting. With ``store``, the name is
    the one its server knows (none if it knows neither: an unknown setting would fail
    every query)."""
    if nice <= 0:
        return {}
    name = NICE_SETTINGS[1]
    if store is not None:
        try:
            known = {r["name"] for r in store.query_rows(
                "SELECT name FROM system.settings WHERE has({names:Array(String)}, name)", {"names": list(NICE_SETTINGS)})}
        except Exception:  # no system.settings to read: leave the queries as they are
            log.warning("cannot read system.settings; diagnosis queries run without a nice value", exc_info=True)
            return {}
        name = next((n for n in NICE_SETTINGS if n in known), "")
        if not name:
            return {}
    return {name: int(nice)}


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message says which store and why."""


class Store:
    """A ClickHouse store (embedded chDB or remote server) with the fleetscope schema.

    Attributes:
        url: the parsed store URL.
        client: clickhouse-connect client used for queries.
    """

    def __init__(self, url: StoreURL, client: Any, query_settings: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.client = client
        self.query_settings: dict[str, Any] = dict(query_settings or {})
        """ClickHouse settings sent with every query of this handle (e.g. the diagnosis
        passes' ``os_thread_priority``: :func:`diagnosis_query_settings`)."""
        self._extra: list[Any] = []
        self._lock = threading.Lock()

    # ---- construction -----------------------------------------------------------
    @classmethod
    def open(cls, url: str | StoreURL | None = None, ttl_days: int = 30, migrate_schema: bool = True) -> Store:
        """Connect to the store at ``url`` and (by default) apply pending migrations.

        Raises:
            StoreURLError: the URL is malformed.
            StoreError: the store cannot be reached or opened.
        """
        parsed = url if isinstance(url, StoreURL) else parse_store_url(url)
        store = cls(parsed, _connect(parsed))
        if migrate_schema:
            try:
                migrate(store.client, ttl_days, cluster=parsed.cluster_spec())
            except Exception as e:
                store.close()
                raise StoreError(f"store {parsed.redacted()}: migration failed: {e}") from e
        return store

    def new_client(self) -> Any:
        """A second client on the same store (its own chdb handle / HTTP session)."""
        client = _connect(self.url)
        with self._lock:
            self._extra.append(client)
        return client

    def sibling(self, query_settings: Mapping[str, Any] | None = None) -> Store:
        """A :class:`Store` on its own client (closed with this one): its calls never wait
        behind this store's (the chdb handle serialises the calls made on it), each query
        with ``query_settings``."""
        return Store(self.url, self.new_client(), query_settings)

    def close(self) -> None:
        with self._lock:
            clients, self._extra = self._extra, []
        for c in [*clients, self.client]:
            try:
                c.close()
            except Exception:  # closing is best effort
                log.debug("closing store client failed", exc_info=True)

    # ---- queries (always parameterised: {name:Type} placeholders) ----------------
    def query_df(self, sql: str, params: Mapping[str, Any] | None = None):
        """Run a SELECT and return a pandas DataFrame."""
        return self.client.query_df(sql, parameters=dict(params or {}), settings=self.query_settings or None)

    def query_rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a SELECT and return its rows as dicts (column name -> value)."""
        result = self.client.query(sql, parameters=dict(params or {}), settings=self.query_settings or None)
        names = result.column_names
        return [dict(zip(names, row)) for row in result.result_rows]

    def query_arrow(self, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
        """Run a SELECT and return an Arrow table."""
        return self.client.query_arrow(sql, parameters=dict(params or {}), settings=self.query_settings or None)

    def command(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.client.command(sql, parameters=dict(params or {}))

    def insert_arrow(self, table_name: str, table: pa.Table, settings: Mapping[str, Any] | None = None) -> None:
        """Insert an Arrow table into ``table_name`` (columns by name)."""
        self.client.insert_arrow(table_name, table, settings=dict(settings or {}))

    def ping(self) -> bool:
        try:
            return bool(self.client.command("SELECT 1") == 1)
        except Exception:
            return False


CLUSTER_CLIENT_SETTINGS = {"insert_distributed_sync": 1}
"""Session settings of every client of a cluster store: an insert into a Distributed table
returns once every shard has its rows (so an acknowledged batch is stored, and its
deduplication token reaches the shards' replicated tables)."""


def _connect(url: StoreURL) -> Any:
    settings: dict[str, Any] | None = dict(CLUSTER_CLIENT_SETTINGS) if url.cluster else None
    try:
        if url.embedded:
            os.makedirs(url.path, exist_ok=True)
            return clickhouse_connect.get_client(dsn=f"chdb://{url.path}")
        client = clickhouse_connect.get_client(
            host=url.host,
            port=url.port,
            username=url.username,
            password=url.password,
            secure=url.scheme == "https",
            database="default",
            compress="lz4",
            settings=settings,
        )
        if url.database != "default":
            on_cluster = f" ON CLUSTER `{url.cluster}`" if url.cluster else ""
            client.command(f"CREATE DATABASE IF NOT EXISTS `{url.database}`{on_cluster}")
            client.close()
            client = clickhouse_connect.get_client(
                host=url.host,
                port=url.port,
                username=url.username,
                password=url.password,
                secure=url.scheme == "https",
                database=url.database,
                compress="lz4",
                settings=settings,
            )
        return client
    except StoreURLError:
        raise
    except Exception as e:
        raise StoreError(f"cannot open store {url.redacted()}: {e}") from e
