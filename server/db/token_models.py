"""Control-plane model of scoped API tokens (only their SHA-256 digests are stored)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import BigInteger, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base


class ApiToken(Base):
    """One bearer token: its scope, optional job/host limits, and when it was revoked.

    The token itself is shown once, at creation; ``digest`` is the hex SHA-256 of it
    (tokens are 256-bit random strings, so a plain digest cannot be reversed by search).
    """

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(16), default="")
    """The first characters of the token, to tell tokens apart in listings."""
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(20))
    jobs: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list of job ids the token is limited to; empty: every job."""
    hosts: Mapped[str] = mapped_column(Text, default="[]")
    """JSON list of host names the token is limited to; empty: every host."""
    created_ns: Mapped[int] = mapped_column(BigInteger, default=0)
    revoked_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the digest."""
        return {
            "id": self.id, "name": self.name, "prefix": self.prefix, "scope": self.scope,
            "jobs": json.loads(self.jobs or "[]"), "hosts": json.loads(self.hosts or "[]"),
            "created_ns": self.created_ns, "revoked_ns": self.revoked_ns,
        }
