"""Control-plane model of jobs (one row per job id, upserted from ``jobs`` records)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base


class Job(Base):
    """A training job: topology, model/device FLOPs, lifetime and status."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(400), default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    dp: Mapped[int] = mapped_column(Integer, default=1)
    tp: Mapped[int] = mapped_column(Integer, default=1)
    pp: Mapped[int] = mapped_column(Integer, default=1)
    order: Mapped[str] = mapped_column(String(20), default="tp-dp-pp")
    num_microbatches: Mapped[int] = mapped_column(Integer, default=1)
    model_flops_per_step: Mapped[float] = mapped_column(Float, default=0.0)
    device_name: Mapped[str] = mapped_column(String(200), default="")
    device_peak_flops: Mapped[float] = mapped_column(Float, default=0.0)
    start_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    status: Mapped[str] = mapped_column(String(20), default="running", index=True)
    command: Mapped[str] = mapped_column(Text, default="")
    versions: Mapped[str] = mapped_column(Text, default="{}")
    host: Mapped[str] = mapped_column(String(200), default="")
    updated_ns: Mapped[int] = mapped_column(BigInteger, default=0)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp
