"""Dashboard pages: each module has ``layout(...)`` and ``register(app, client)``."""
