"""Versioned, idempotent store migrations.

Each migration is a version number, a name and a function of the store settings that
returns its DDL statements. Statements use ``IF NOT EXISTS`` so re-running a partly
applied migration (a crash half way) is safe; a version is recorded in
``schema_migrations`` only after all its statements ran. Add new versions at the end;
never edit an applied one.

On a ClickHouse cluster (store URL ``...?cluster=NAME``) the same statements are
rendered by :mod:`.cluster` (``ON CLUSTER``, Replicated engines, Distributed tables)
before they run; every rendered statement is idempotent too (``IF NOT EXISTS``), so two
server replicas migrating at once, or a migration re-run after a crash, are safe.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from fleetscope.schema import RECORD_TYPES

from . import ddl
from .cluster import LOCAL_SUFFIX, Cluster, Renderer, migrations_table_ddl

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
    Migration(2, "rollup communication as the union of a rank-step's op intervals", ddl.schema_v2_statements),
    Migration(3, "each rank's newest in-flight row kept at insert time", ddl.schema_v3_statements),
    Migration(4, "heartbeats say up to when each rank's records are acknowledged", ddl.schema_v4_statements),
    Migration(5, "each rank process's heartbeat state kept at insert time", ddl.schema_v5_statements),
    Migration(6, "each rank's newest work per group kept at insert time", ddl.schema_v6_statements),
    Migration(7, "sections carry the CPU time of the thread that ran them", ddl.schema_v7_statements),
)


def applied_versions(client, cluster: Cluster | None = None) -> set[int]:
    client.command(migrations_table_ddl(MIGRATIONS_TABLE, cluster))
    return {int(r[0]) for r in client.query(f"SELECT version FROM {MIGRATIONS_TABLE}").result_rows}


def cluster_renderer(cluster: Cluster, ttl_days: int) -> Renderer:
    """A renderer that knows every table and view of every migration."""
    return Renderer.for_statements(cluster, [s for m in MIGRATIONS for s in m.statements(ttl_days)])


def statements_of(m: Migration, ttl_days: int, cluster: Cluster | None = None) -> list[str]:
    """The statements a migration runs: as written for one node, or rendered for ``cluster``."""
    stmts = m.statements(ttl_days)
    return stmts if cluster is None else cluster_renderer(cluster, ttl_days).render_all(stmts)


def migrate(client, ttl_days: int, cluster: Cluster | None = None) -> list[int]:
    """Apply every pending migration; returns the versions applied now.

    Also brings the TTL of existing tables in line with ``ttl_days`` (a setting that
    may change between restarts).

    Args:
        cluster: render every statement for this ClickHouse cluster (None: one node).
    """
    done = applied_versions(client, cluster)
    applied = []
    for m in MIGRATIONS:
        if m.version in done:
            continue
        for stmt in statements_of(m, ttl_days, cluster):
            client.command(stmt)
        client.command(
            f"INSERT INTO {MIGRATIONS_TABLE} (version, name) VALUES ({{v:UInt32}}, {{n:String}})",
            parameters={"v": m.version, "n": m.name},
        )
        log.info("store migration %d applied: %s%s", m.version, m.name,
                 f" (on cluster {cluster.name})" if cluster else "")
        applied.append(m.version)
    _sync_ttl(client, ttl_days, cluster)
    return applied


_TTL_RE = re.compile(r"TTL .*? \+ toIntervalDay\((\d+)\)")


def ttl_statements(current: dict[str, str], ttl_days: int, cluster: Cluster | None = None) -> list[str]:
    """ALTER ... MODIFY/REMOVE TTL for record tables whose TTL differs from ``ttl_days``.

    Args:
        current: table name -> ``create_table_query`` (from ``system.tables``).
    """
    out = []
    for rt in RECORD_TYPES.values():
        query = current.get(rt.name + (LOCAL_SUFFIX if cluster else ""))
        if query is None:
            continue
        m = _TTL_RE.search(query)
        have = int(m.group(1)) if m else 0
        if have == ttl_days:
            continue
        stmt = (f"ALTER TABLE `{rt.name}` MODIFY {ddl.ttl_clause(rt, ttl_days)}" if ttl_days > 0
                else f"ALTER TABLE `{rt.name}` REMOVE TTL")  # fmt: skip
        out += [stmt] if cluster is None else Renderer(cluster, RECORD_TYPES).render(stmt)
        log.info("store table %s: TTL %d -> %d days", rt.name, have, ttl_days)
    return out


def _sync_ttl(client, ttl_days: int, cluster: Cluster | None = None) -> None:
    """ALTER ... MODIFY/REMOVE TTL on tables whose TTL differs from the setting."""
    rows = client.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase()"
    ).result_rows
    for stmt in ttl_statements({name: query for name, query in rows}, ttl_days, cluster):
        client.command(stmt, settings={"materialize_ttl_after_modify": 0})
