"""Versioned, idempotent store migrations.

Each migration is a version number, a name and a function of the store settings that
returns its DDL statements. Statements use ``IF NOT EXISTS`` so re-running a partly
applied migration (a crash half way) is safe; a version is recorded in
``schema_migrations`` only after all its statements ran. Add new versions at the end;
never edit an applied one.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from fleetscope.schema import RECORD_TYPES

from . import ddl

log = logging.getLogger(__name__)

MIGRATIONS_TABLE = "schema_migrations"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: Callable[[int], list[str]]
    """ttl_days -> DDL statements."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "record tables, ingest batch registry, per-rank-per-step rollup", ddl.schema_v1_statements),
)


def applied_versions(client) -> set[int]:
    client.command(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version UInt32, name String, "
        "applied_at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY version"
    )
    return {int(r[0]) for r in client.query(f"SELECT version FROM {MIGRATIONS_TABLE}").result_rows}


def migrate(client, ttl_days: int) -> list[int]:
    """Apply every pending migration; returns the versions applied now.

    Also brings the TTL of existing tables in line with ``ttl_days`` (a setting that
    may change between restarts).
    """
    done = applied_versions(client)
    applied = []
    for m in MIGRATIONS:
        if m.version in done:
            continue
        for stmt in m.statements(ttl_days):
            client.command(stmt)
        client.command(
            f"INSERT INTO {MIGRATIONS_TABLE} (version, name) VALUES ({{v:UInt32}}, {{n:String}})",
            parameters={"v": m.version, "n": m.name},
        )
        log.info("store migration %d applied: %s", m.version, m.name)
        applied.append(m.version)
    _sync_ttl(client, ttl_days)
    return applied


_TTL_RE = re.compile(r"TTL .*? \+ toIntervalDay\((\d+)\)")


def _sync_ttl(client, ttl_days: int) -> None:
    """ALTER ... MODIFY/REMOVE TTL on tables whose TTL differs from the setting."""
    rows = client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase()"
    ).result_rows
    current = {name: query for name, query in rows}
    for rt in RECORD_TYPES.values():
        query = current.get(rt.name)
        if query is None:
            continue
        m = _TTL_RE.search(query)
        have = int(m.group(1)) if m else 0
        if have == ttl_days:
            continue
        if ttl_days > 0:
            client.command(
                f"ALTER TABLE `{rt.name}` MODIFY {ddl.ttl_clause(rt, ttl_days)}",
                settings={"materialize_ttl_after_modify": 0},
            )
        else:
            client.command(f"ALTER TABLE `{rt.name}` REMOVE TTL")
        log.info("store table %s: TTL %d -> %d days", rt.name, have, ttl_days)
