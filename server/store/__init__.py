"""fleetscope.server.store: the ClickHouse telemetry store (embedded chDB or a server).

``Store.open(url)`` connects and applies the versioned migrations whose DDL is derived
from :mod:`fleetscope.schema`; ``queries`` holds the parameterised SQL.
"""

from .client import Store, StoreError, diagnosis_query_settings
from .url import StoreURL, StoreURLError, parse_store_url

__all__ = ["Store", "StoreError", "diagnosis_query_settings", "StoreURL", "StoreURLError", "parse_store_url"]
