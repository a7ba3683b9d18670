"""Pure shaping of the dashboard views' data: frames in, JSON-ready dicts out (no I/O).

The SQL lives in :mod:`fleetscope.server.store.view_queries`; the routes in
:mod:`fleetscope.server.api.routes.views` glue the two together.
"""
