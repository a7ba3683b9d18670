"""Alembic environment: runs on the connection handed over by ``db.base.upgrade``
(or on ``sqlalchemy.url`` when invoked from the alembic command line)."""

from __future__ import annotations

import fleetscope.server.db.models  # noqa: F401  (registers the models)
from alembic import context
from fleetscope.server.db.base import Base
from sqlalchemy import engine_from_config, pool

target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = engine_from_config(
        context.config.get_section(context.config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as conn:
        _run(conn)
