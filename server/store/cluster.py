"""The ClickHouse *cluster* variant of the store schema, rendered from the single-node DDL.

No DDL is written twice: every statement of every migration (:mod:`.ddl`,
:mod:`.migrations`) is rewritten mechanically, so a table or materialized view added to
the single-node schema gets its cluster variant with no extra work.

Layout on a cluster named ``C`` (store URL ``http://user:pass@host:8123/db?cluster=C``):

* each table ``t`` becomes ``t_local`` on every node (``ON CLUSTER C``), with its
  MergeTree engine replaced by the Replicated one (``ReplicatedAggregatingMergeTree``
  for ``AggregatingMergeTree`` ...) under the Keeper path
  ``/clickhouse/tables/{shard}/{database}/{table}`` and replica ``{replica}`` (macros
  every node defines), and ``non_replicated_deduplication_window`` turned into
  ``replicated_deduplication_window``; plus ``t`` itself, a ``Distributed`` table over
  ``t_local``. Queries and inserts keep using ``t``, so no query is rewritten.
* each materialized view is created ``ON CLUSTER`` and reads and writes *local* tables
  (``FROM sections_local`` ... ``TO step_rollup_local``): a view fires on the node that
  receives a block, i.e. on the shard that stores it, so every shard keeps the rollup of
  its own rows, and ``Distributed`` over the rollup merges the shards at query time.
* rows are sharded by :func:`sharding_key`: ``(job, rank)`` wherever a table has both
  columns (and is not keyed by host first), so every raw row of one rank, and so every
  ``step_rollup`` row of one (job, attempt, step, rank), lives on one shard: the
  rollup's ``FINAL`` reads stay exact. Host-keyed tables shard by ``host``. A rollup
  whose key lacks ``rank`` (per group, say) holds partial rows on several shards, and
  its queries must group again (as ``queries`` does anyway for unmerged parts).
* ``schema_migrations`` is one replicated table that every node holds in full (one
  Keeper path, no ``{shard}``), so any node answers which versions are applied.

What the renderer accepts: ``CREATE TABLE`` with a column list and a ``*MergeTree`` or
``Null`` engine, ``CREATE MATERIALIZED VIEW ... TO``, ``CREATE VIEW``, ``ALTER TABLE``
(column changes go to both tables, the rest to the local one), ``DROP TABLE|VIEW``
and ``INSERT`` (left as is: it goes through the Distributed tables). Anything else
raises :class:`ClusterDDLError` naming the statement, so a new kind of DDL cannot be
applied to a cluster half-translated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

LOCAL_SUFFIX: Final = "_local"
KEEPER_PATH: Final = "/clickhouse/tables/{shard}/{database}/{table}"
"""Keeper path of each shard's replicas of a table (``{shard}``, ``{replica}`` are node macros)."""
KEEPER_PATH_ALL: Final = "/clickhouse/tables/all/{database}/{table}"
"""Keeper path of a table every node holds in full."""
NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ClusterDDLError(ValueError):
    """A statement the cluster renderer cannot translate (the message shows its start)."""


@dataclass(frozen=True)
class Cluster:
    """Where cluster DDL goes: the cluster name (``remote_servers``) and the database."""

    name: str
    database: str

    def __post_init__(self) -> None:
        for what, v in (("cluster", self.name), ("database", self.database)):
            if not NAME_RE.match(v):
                raise ClusterDDLError(f"{what} name {v!r}: expected letters, digits and '_'")

    @property
    def on(self) -> str:
        return f"ON CLUSTER `{self.name}`"


# ---- a small SQL tokenizer: enough to never rewrite inside a string or a comment ----------
_TOKEN = re.compile(
    r"(?P<str>'(?:[^'\\]|\\.|'')*')|(?P<qid>`(?:[^`\\]|\\.)*`)|(?P<dq>\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<comment>--[^\n]*|/\*.*?\*/)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<space>\s+)|(?P<other>.)",
    re.S,
)


def _tokens(sql: str) -> list[tuple[str, str]]:
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(sql)]


def _ident(tok: tuple[str, str]) -> str | None:
    kind, text = tok
    if kind == "word":
        return text
    if kind == "qid":
        return text[1:-1]
    return None


def _next(toks: list[tuple[str, str]], i: int) -> int:
    """Index of the next token after ``i`` that is not whitespace or a comment."""
    i += 1
    while i < len(toks) and toks[i][0] in ("space", "comment"):
        i += 1
    return i


def _qid(name: str) -> tuple[str, str]:
    return ("qid", f"`{name}`")


def _localize_refs(sql: str, tables: set[str], keywords: tuple[str, ...] = ("FROM", "JOIN")) -> str:
    """Point table references after ``keywords`` at the local tables."""
    toks = _tokens(sql)
    for i, (kind, text) in enumerate(toks):
        if kind == "word" and text.upper() in keywords:
            j = _next(toks, i)
            if j < len(toks):
                name = _ident(toks[j])
                k = _next(toks, j)
                qualified = k < len(toks) and toks[k][1] == "."
                if name in tables and not qualified:
                    toks[j] = _qid(name + LOCAL_SUFFIX)
    return "".join(t for _, t in toks)


def _balanced(sql: str, start: int) -> int:
    """Index just past the parenthesis group opening at ``sql[start] == '('``."""
    depth = 0
    pos = start
    for kind, text in _tokens(sql[start:]):
        if kind == "other" and text == "(":
            depth += 1
        elif kind == "other" and text == ")":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += len(text)
    raise ClusterDDLError(f"unbalanced parentheses in: {sql[:80]!r}")


def _split_top(inner: str) -> list[str]:
    """Split on commas at depth 0 (the items of a column list)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for kind, text in _tokens(inner):
        if kind == "other" and text in "([":
            depth += 1
        elif kind == "other" and text in ")]":
            depth -= 1
        if kind == "other" and text == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(text)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


# ---- statements ----------------------------------------------------------------------------
_NAME = r"(?:`(?P<{g}q>[^`]+)`|(?P<{g}w>[A-Za-z_][A-Za-z0-9_]*))"
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?P<ine>IF\s+NOT\s+EXISTS\s+)?" + _NAME.format(g="n") + r"\s*\(",
                           re.I)  # fmt: skip
_CREATE_MV = re.compile(
    r"^\s*CREATE\s+MATERIALIZED\s+VIEW\s+(?P<ine>IF\s+NOT\s+EXISTS\s+)?" + _NAME.format(g="n")
    + r"\s+TO\s+" + _NAME.format(g="t") + r"(?P<rest>.*)$", re.I | re.S)  # fmt: skip
_CREATE_VIEW = re.compile(r"^\s*CREATE\s+VIEW\s+(?P<ine>IF\s+NOT\s+EXISTS\s+)?" + _NAME.format(g="n")
                          + r"(?P<rest>\s.*)$", re.I | re.S)  # fmt: skip
_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s+" + _NAME.format(g="n") + r"\s+(?P<rest>.*)$", re.I | re.S)
_DROP = re.compile(r"^\s*DROP\s+(?P<what>TABLE|VIEW)\s+(?P<ie>IF\s+EXISTS\s+)?" + _NAME.format(g="n")
                   + r"(?P<rest>.*)$", re.I | re.S)  # fmt: skip
_ENGINE = re.compile(r"^\s*ENGINE\s*=\s*(?P<engine>[A-Za-z]+)", re.I)
_ORDER_BY = re.compile(r"\bORDER\s+BY\s+(\([^)]*\)|\S+)", re.I)
_COLUMN_ALTERS = re.compile(r"^\s*(ADD|DROP|MODIFY|RENAME|COMMENT)\s+COLUMN\b", re.I)
_ENGINE_KEYWORDS = ("INDEX", "PROJECTION", "CONSTRAINT")


def _name(m: re.Match, g: str = "n") -> str:
    return m.group(g + "q") or m.group(g + "w")


def _ine(m: re.Match) -> str:
    return "IF NOT EXISTS " if m.group("ine") else ""


@dataclass(frozen=True)
class TableDef:
    """What the renderer read from one single-node ``CREATE TABLE``."""

    name: str
    columns: tuple[str, ...]
    column_list: str
    engine: str
    engine_args: str
    rest: str
    """Everything after the engine (PARTITION BY, ORDER BY, TTL, SETTINGS)."""
    order_by: tuple[str, ...]


def parse_create_table(sql: str) -> TableDef | None:
    """The parts of a ``CREATE TABLE name (columns) ENGINE = E[(args)] ...`` (None: another statement)."""
    m = _CREATE_TABLE.match(sql)
    if not m:
        return None
    open_at = m.end() - 1
    close_at = _balanced(sql, open_at)
    column_list = sql[open_at:close_at]
    cols = []
    for item in _split_top(column_list[1:-1]):
        toks = [t for t in _tokens(item) if t[0] not in ("space", "comment")]
        if toks and not (toks[0][0] == "word" and toks[0][1].upper() in _ENGINE_KEYWORDS):
            cols.append(_ident(toks[0]) or "")
    tail = sql[close_at:]
    em = _ENGINE.match(tail)
    if not em:
        raise ClusterDDLError(f"CREATE TABLE {_name(m)}: no ENGINE clause right after the columns")
    engine, after = em.group("engine"), tail[em.end():]
    args = ""
    if after.lstrip().startswith("("):
        lead = len(after) - len(after.lstrip())
        end = _balanced(after, lead)
        args, after = after[lead + 1:end - 1], after[end:]
    om = _ORDER_BY.search(after)
    order: tuple[str, ...] = ()
    if om:
        order = tuple(x.strip().strip("`") for x in om.group(1).strip("()").split(","))
    return TableDef(_name(m), tuple(cols), column_list, engine, args.strip(), after, order)


def sharding_key(t: TableDef) -> str:
    """The Distributed sharding expression of a table (see the module docstring)."""
    cols = set(t.columns)
    first = t.order_by[0] if t.order_by else ""
    if {"job", "rank"} <= cols and first != "host":
        return "cityHash64(toString(`job`), toInt64(`rank`))"
    if "host" in cols:
        return "cityHash64(toString(`host`))"
    if first and first in cols:
        return f"cityHash64(toString(`{first}`))"
    return "rand()"


def _replicated_engine(t: TableDef, path: str = KEEPER_PATH) -> str:
    if t.engine.endswith("MergeTree"):
        base = t.engine[len("Replicated"):] if t.engine.startswith("Replicated") else t.engine
        args = [f"'{path}'", "'{replica}'"] + ([t.engine_args] if t.engine_args else [])
        return f"Replicated{base}({', '.join(args)})"
    if t.engine == "Null":
        return "Null"
    raise ClusterDDLError(f"CREATE TABLE {t.name}: engine {t.engine} has no cluster rendering "
                          "(use a *MergeTree or Null engine)")  # fmt: skip


def _replicated_rest(rest: str) -> str:
    return re.sub(r"\bnon_replicated_deduplication_window\b", "replicated_deduplication_window", rest)


class Renderer:
    """Renders single-node statements for one cluster; knows every table of the schema."""

    def __init__(self, cluster: Cluster, tables: Iterable[str], views: Iterable[str] = ()) -> None:
        self.cluster = cluster
        self.tables = set(tables)
        self.views = set(views)

    @classmethod
    def for_statements(cls, cluster: Cluster, statements: Iterable[str]) -> Renderer:
        """A renderer that knows the tables and views created by ``statements``."""
        tables, views = set(), set()
        for s in statements:
            t = parse_create_table(s)
            if t is not None:
                tables.add(t.name)
            m = _CREATE_MV.match(s) or _CREATE_VIEW.match(s)
            if m:
                views.add(_name(m))
        return cls(cluster, tables, views)

    def render(self, sql: str) -> list[str]:
        """The cluster statements for one single-node statement, in execution order."""
        c = self.cluster
        t = parse_create_table(sql)
        if t is not None:
            self.tables.add(t.name)
            local = t.name + LOCAL_SUFFIX
            head = _CREATE_TABLE.match(sql)
            ine = "IF NOT EXISTS " if head is not None and head.group("ine") else ""
            create_local = (f"CREATE TABLE {ine}`{local}` {c.on} {t.column_list} "
                            f"ENGINE = {_replicated_engine(t)}{_replicated_rest(t.rest)}")  # fmt: skip
            create_dist = (f"CREATE TABLE {ine}`{t.name}` {c.on} AS `{local}`\n"
                           f"ENGINE = Distributed(`{c.name}`, `{c.database}`, `{local}`, {sharding_key(t)})")  # fmt: skip
            return [create_local, create_dist]
        m = _CREATE_MV.match(sql)
        if m:
            self.views.add(_name(m))
            target = _name(m, "t")
            if target not in self.tables:
                raise ClusterDDLError(f"materialized view {_name(m)}: target {target!r} is not a table of the schema")
            rest = _localize_refs(m.group("rest"), self.tables)
            return [f"CREATE MATERIALIZED VIEW {_ine(m)}`{_name(m)}` {c.on} TO `{target}{LOCAL_SUFFIX}`{rest}"]
        m = _CREATE_VIEW.match(sql)
        if m:  # a plain view reads at query time: through the Distributed tables
            self.views.add(_name(m))
            return [f"CREATE VIEW {_ine(m)}`{_name(m)}` {c.on}{m.group('rest')}"]
        m = _ALTER.match(sql)
        if m:
            name, rest = _name(m), m.group("rest")
            if name in self.views:
                return [f"ALTER TABLE `{name}` {c.on} {_localize_refs(rest, self.tables)}"]
            if name not in self.tables:
                raise ClusterDDLError(f"ALTER TABLE {name}: not a table of the schema")
            out = [f"ALTER TABLE `{name}{LOCAL_SUFFIX}` {c.on} {rest}"]
            if _COLUMN_ALTERS.match(rest):  # the Distributed table's columns follow the local ones
                out.append(f"ALTER TABLE `{name}` {c.on} {rest}")
            return out
        m = _DROP.match(sql)
        if m:
            name, ie, rest = _name(m), "IF EXISTS " if m.group("ie") else "", m.group("rest")
            what = m.group("what").upper()
            out = [f"DROP {what} {ie}`{name}` {c.on}{rest}"]
            if name in self.tables:
                out.append(f"DROP TABLE {ie}`{name}{LOCAL_SUFFIX}` {c.on}{rest}")
            return out
        if re.match(r"^\s*INSERT\s", sql, re.I):
            return [sql]
        raise ClusterDDLError(f"no cluster rendering for: {' '.join(sql.split())[:80]!r}")

    def render_all(self, statements: Sequence[str]) -> list[str]:
        return [out for s in statements for out in self.render(s)]


def migrations_table_ddl(table: str, cluster: Cluster | None) -> str:
    """``CREATE TABLE`` of the migrations registry (single node, or in full on every node)."""
    cols = "(version UInt32, name String, applied_at DateTime DEFAULT now())"
    if cluster is None:
        return f"CREATE TABLE IF NOT EXISTS {table} {cols} ENGINE = MergeTree ORDER BY version"
    return (f"CREATE TABLE IF NOT EXISTS `{table}` {cluster.on} {cols} "
            f"ENGINE = ReplicatedReplacingMergeTree('{KEEPER_PATH_ALL}', '{{replica}}') ORDER BY version")  # fmt: skip
