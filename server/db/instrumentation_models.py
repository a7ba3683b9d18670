"""Control-plane model of runtime control: each job's instrumentation level."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base


class Instrumentation(Base):
    """The instrumentation level the hooks of a job's ranks should run at.

    ``level`` applies to every rank; ``ranks`` (JSON ``{"<rank>": level}``) overrides it
    for the ranks it names. ``version`` grows with every change; agents write it into
    the spool's control file (see ``fleetscope.control``).
    """

    __tablename__ = "instrumentation"

    job: Mapped[str] = mapped_column(String(200), primary_key=True)
    level: Mapped[str] = mapped_column(String(20), default="full")
    ranks: Mapped[str] = mapped_column(Text, default="{}")
    version: Mapped[int] = mapped_column(Integer, default=0)
    updated_ns: Mapped[int] = mapped_column(BigInteger, default=0)
