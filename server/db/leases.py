"""Per-job diagnosis leases: two diagnosis workers never diagnose the same job at once.

A worker claims a job before a pass (``claim``): one conditional UPDATE takes the row
when it is free, expired or already its own, else an INSERT creates it; a lost race
(``IntegrityError`` or no row updated) means another worker holds it. The lease lasts
``ttl_s`` and is renewed by every pass; a worker that dies loses its leases when they
expire. The same statements work on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import BigInteger, CursorResult, String, delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column

from .base import Base


class DiagnosisLease(Base):
    __tablename__ = "diagnosis_leases"

    job: Mapped[str] = mapped_column(String(200), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200), default="")
    expires_ns: Mapped[int] = mapped_column(BigInteger, default=0)


def claim(session: Session, job: str, owner: str, now_ns: int, ttl_s: float) -> bool:
    """Take or renew ``job``'s lease for ``owner``; False when another owner holds it."""
    until = now_ns + int(ttl_s * 1e9)
    # an UPDATE's result is a CursorResult (rowcount); Session.execute is typed as Result
    res = cast(CursorResult, session.execute(
        update(DiagnosisLease)
        .where(DiagnosisLease.job == job)
        .where((DiagnosisLease.owner == owner) | (DiagnosisLease.expires_ns < now_ns))
        .values(owner=owner, expires_ns=until)
    ))
    if res.rowcount:
        session.commit()
        return True
    session.rollback()
    if session.get(DiagnosisLease, job) is not None:
        return False
    try:
        session.add(DiagnosisLease(job=job, owner=owner, expires_ns=until))
        session.commit()
        return True
    except IntegrityError:
        session.rollback()
        return False


def release_all(session: Session, owner: str) -> int:
    """Give up every lease of ``owner`` (a worker stopping)."""
    res = cast(CursorResult, session.execute(
        delete(DiagnosisLease).where(DiagnosisLease.owner == owner)))
    n = res.rowcount
    session.commit()
    return int(n or 0)
