"""Importers: telemetry users already have (Flight Recorder dumps, profiler traces)."""
