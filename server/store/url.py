"""Store URLs: which ClickHouse the server talks to.

* ``chdb:///abs/dir`` — embedded ClickHouse (chDB) in an absolute directory;
* ``chdb://rel/dir`` — embedded, relative to the current working directory;
* ``http://user:pass@host:8123/db`` or ``https://...`` — a ClickHouse server;
* ``http://user:pass@host:8123/db?cluster=NAME`` — a ClickHouse cluster (``NAME`` as in the
  servers' ``remote_servers``): the schema is created ``ON CLUSTER`` with Replicated and
  Distributed tables (:mod:`fleetscope.server.store.cluster`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from fleetscope.config import DEFAULT_STORE_URL


class StoreURLError(ValueError):
    """A store URL that cannot be used; the message names it (password redacted)."""


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL."""

    scheme: str
    """``chdb``, ``http`` or ``https``."""
    path: str = ""
    """Absolute chDB directory (``chdb`` only)."""
    host: str = ""
    port: int = 0
    username: str = "default"
    password: str = field(default="", repr=False)
    database: str = "default"
    cluster: str = ""
    """ClickHouse cluster name ('' for a single server)."""

    @property
    def embedded(self) -> bool:
        return self.scheme == "chdb"

    def cluster_spec(self):
        """The :class:`~fleetscope.server.store.cluster.Cluster` to render DDL for (None: one node)."""
        from .cluster import Cluster

        return Cluster(self.cluster, self.database) if self.cluster else None

    def redacted(self) -> str:
        """The URL for logs and messages, without the password."""
        if self.embedded:
            return f"chdb://{self.path}"
        auth = f"{self.username}:***@" if self.password else f"{self.username}@"
        query = f"?cluster={self.cluster}" if self.cluster else ""
        return f"{self.scheme}://{auth}{self.host}:{self.port}/{self.database}{query}"


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


def parse_store_url(url: str | None = None, cwd: str | None = None) -> StoreURL:
    """Parse a store URL; ``None`` or ``""`` means the default embedded store.

    Args:
        url: ``chdb:///abs``, ``chdb://rel`` or ``http(s)://user:pass@host:port/db``.
        cwd: directory that relative chDB paths are resolved against (default: the
            process's working directory).

    Raises:
        StoreURLError: the URL is malformed; the message names it.
    """
    url = url or DEFAULT_STORE_URL
    if url.startswith("chdb://"):
        rest = url[len("chdb://") :]
        if not rest or rest == "/":
            raise StoreURLError(f"store URL {url!r} names no directory (chdb:///abs/dir or chdb://rel/dir)")
        if "?" in rest or "#" in rest:
            raise StoreURLError(f"store URL {url!r}: chdb URLs take no query string")
        path = rest if rest.startswith("/") else os.path.join(cwd or os.getcwd(), rest)
        return StoreURL(scheme="chdb", path=os.path.normpath(path))
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise StoreURLError(
            f"store URL {_redact(url)!r}: unsupported scheme {parts.scheme!r}; "
            "use chdb:///dir, chdb://rel/dir, http://... or https://..."
        )
    if not parts.hostname:
        raise StoreURLError(f"store URL {_redact(url)!r} names no host")
    try:
        port = parts.port or (8443 if parts.scheme == "https" else 8123)
    except ValueError:
        raise StoreURLError(f"store URL {_redact(url)!r}: bad port") from None
    database = parts.path.strip("/") or "default"
    if not database.replace("_", "").isalnum():
        raise StoreURLError(f"store URL {_redact(url)!r}: bad database name {database!r}")
    try:
        query = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError:
        raise StoreURLError(f"store URL {_redact(url)!r}: malformed query string") from None
    unknown = sorted(set(query) - {"cluster"})
    if unknown:
        raise StoreURLError(f"store URL {_redact(url)!r}: unknown option {unknown[0]!r} (only ?cluster=NAME)")
    cluster = query.get("cluster", "")
    if "cluster" in query and not _is_name(cluster):
        raise StoreURLError(f"store URL {_redact(url)!r}: bad cluster name {cluster!r} (letters, digits, '_')")
    return StoreURL(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        username=unquote(parts.username) if parts.username else "default",
        password=unquote(parts.password) if parts.password else "",
        database=database,
        cluster=cluster,
    )


def _is_name(v: str) -> bool:
    return bool(v) and len(v) <= 64 and (v[0].isalpha() or v[0] == "_") and v.replace("_", "").isalnum() and v.isascii()
