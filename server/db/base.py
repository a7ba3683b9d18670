"""Control-plane SQL database: engine, sessions and Alembic migrations.

SQLite by default (``sqlite:///./.fleetscope/control.db``), PostgreSQL by URL
(``postgresql+psycopg://user:pass@host/db``). The schema is managed by Alembic only:
:func:`open_db` upgrades to ``head`` at server start. Model modules live next to this
one (``models.py`` and those added by other components) and share :class:`Base`.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


class Base(DeclarativeBase):
    """Declarative base of every control-plane model."""


def make_engine(url: str) -> Engine:
    """Create an engine; for SQLite also create the parent directory and enable WAL."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def alembic_config(engine: Engine):
    """An Alembic config bound to ``engine`` (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Apply Alembic migrations up to ``revision`` (idempotent)."""
    from alembic import command

    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def open_db(url: str, migrate: bool = True) -> sessionmaker[Session]:
    """Engine + migrations + a sessionmaker (``expire_on_commit=False``)."""
    engine = make_engine(url)
    if migrate:
        upgrade(engine)
    return sessionmaker(engine, expire_on_commit=False)
