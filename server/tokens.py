"""Scoped API tokens: made, listed and revoked in the control-plane DB; checked per request.

Scopes (see README "Authentication and tokens" for the route table):

* ``ingest`` - agents and trainers: ``POST /api/v1/ingest`` and ``GET /api/v1/clock``
  only; cannot read anything else, nor read or change alert rules.
* ``read`` - every ``GET`` (the dashboard, scripts); changes nothing.
* ``admin`` - everything, including alert rules, webhooks and incident actions.

A token may also be limited to jobs and/or hosts. The static ``FLEETSCOPE_TOKEN`` is an
unlimited ``admin`` token. Tokens are ``fst_`` + 43 URL-safe characters (256 random
bits); the DB keeps only their SHA-256 hex digest, and the token is shown once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field

from fleetscope.server.db.token_models import ApiToken
from sqlalchemy import func, select
from sqlalchemy.orm import Session

SCOPES = ("ingest", "read", "admin")
TOKEN_PREFIX = "fst_"
MAX_LIMIT_ITEMS = 1000


class TokenError(ValueError):
    """A bad scope, limit or token id (the message names it)."""


@dataclass(frozen=True)
class Principal:
    """Who a request is: the scope of its token and what the token is limited to."""

    scope: str
    name: str = ""
    token_id: int | None = None
    """``None`` for the static ``FLEETSCOPE_TOKEN`` (and for an open server)."""
    jobs: frozenset[str] = field(default_factory=frozenset)
    """Jobs the token may touch; empty: every job."""
    hosts: frozenset[str] = field(default_factory=frozenset)
    """Hosts the token may act for or read; empty: every host."""

    def allows(self, needed: str) -> bool:
        """Whether this principal's scope covers ``needed`` (admin covers all)."""
        return self.scope == "admin" or self.scope == needed


ADMIN = Principal("admin", "static token")
OPEN = Principal("admin", "no authentication configured")


def digest(token: str) -> str:
    """Hex SHA-256 of a token (what the DB stores)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _limits(values, what: str) -> list[str]:
    out = sorted({str(v).strip() for v in values or () if str(v).strip()})
    if len(out) > MAX_LIMIT_ITEMS:
        raise TokenError(f"--{what}: at most {MAX_LIMIT_ITEMS} entries, got {len(out)}")
    for v in out:
        if len(v) > 200:
            raise TokenError(f"--{what}: {v[:40]!r}... is longer than 200 characters")
    return out


def create_token(session: Session, scope: str, name: str = "", jobs=(), hosts=()) -> tuple[str, dict]:
    """Make a token; returns ``(token, its public record)``. The token is not stored."""
    if scope not in SCOPES:
        raise TokenError(f"scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if len(name) > 200:
        raise TokenError("name: at most 200 characters")
    if scope == "ingest" and jobs:
        # the job of ingested rows is inside the body, which the token check does not decode
        raise TokenError("--jobs: an ingest token can be limited to hosts (--hosts), not to jobs")
    token = new_token()
    row = ApiToken(name=name, prefix=token[: len(TOKEN_PREFIX) + 6], digest=digest(token), scope=scope,
                   jobs=json.dumps(_limits(jobs, "jobs")), hosts=json.dumps(_limits(hosts, "hosts")),
                   created_ns=time.time_ns(), revoked_ns=None)
    session.add(row)
    session.commit()
    return token, row.to_dict()


def list_tokens(session: Session, include_revoked: bool = False) -> list[dict]:
    q = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        q = q.where(ApiToken.revoked_ns.is_(None))
    return [t.to_dict() for t in session.scalars(q)]


def revoke_token(session: Session, token_id: int) -> dict:
    """Revoke by id (idempotent). Raises :class:`TokenError` for an unknown id."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise TokenError(f"token id {token_id}: no such token")
    if row.revoked_ns is None:
        row.revoked_ns = time.time_ns()
        session.commit()
    return row.to_dict()


def any_tokens(session: Session) -> bool:
    """Whether a token was ever made (revoked ones count: revoking the last token must
    not turn authentication off)."""
    return bool(session.scalar(select(func.count()).select_from(ApiToken)))


def lookup(session: Session, token: str) -> Principal | None:
    """The principal of a presented token, or ``None`` (unknown, revoked, malformed)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    want = digest(token)
    row = session.scalar(select(ApiToken).where(ApiToken.digest == want))
    # the row was found by its digest; compare again in constant time all the same
    if row is None or row.revoked_ns is not None or not hmac.compare_digest(row.digest, want):
        return None
    return Principal(row.scope, row.name, row.id, frozenset(json.loads(row.jobs or "[]")),
                     frozenset(json.loads(row.hosts or "[]")))
