"""Defaults shared by every component (ports, paths), in one place."""

from __future__ import annotations

from typing import Final

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8000
DEFAULT_STORE_URL: Final = "chdb://./.fleetscope/store"
"""Embedded ClickHouse (chDB) in ./.fleetscope/store, relative to the working directory."""
DEFAULT_DB_URL: Final = "sqlite:///./.fleetscope/control.db"
DEFAULT_SPOOL_DIR: Final = "./.fleetscope/spool"
API_PREFIX: Final = "/api/v1"
ENV_PREFIX: Final = "FLEETSCOPE_"

UI_COOKIE: Final = "fleetscope_ui"
"""Cookie the server's /ui login sets (HttpOnly, SameSite=Strict) and the mounted
dashboard forwards as the browser's bearer token."""
