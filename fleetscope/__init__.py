"""fleetscope: observability and diagnosis for large LLM training fleets."""

__version__ = "0.1.0"
