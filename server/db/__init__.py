"""fleetscope.server.db: control-plane SQL state (SQLAlchemy 2.x + Alembic)."""

from .base import Base, open_db, upgrade
from .models import Job

__all__ = ["Base", "Job", "open_db", "upgrade"]
