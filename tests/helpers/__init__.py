"""Shared test helpers (real servers on loopback, data builders)."""
