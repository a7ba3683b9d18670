"""fleetscope.collector: the write path.

Decode and validate batches (:mod:`.validate`), coalesce them into large inserts with
exactly-once batch semantics (:mod:`.writer`), and keep the control-plane ``jobs`` rows
in step (:mod:`.jobs_sync`). It runs inside the server process
(``fleetscope server``); the HTTP route is ``fleetscope.server.api.routes.ingest``.
"""

from .validate import (
    BatchError,
    IngestLimits,
    UnsupportedContentType,
    decode_request,
    is_malformed,
    prepare,
)
from .writer import (
    Backpressure,
    IngestResult,
    IngestWriter,
    KeyConflict,
    PoisonBatch,
    WriteError,
    content_digest,
)

__all__ = [
    "Backpressure",
    "BatchError",
    "IngestLimits",
    "IngestResult",
    "IngestWriter",
    "KeyConflict",
    "PoisonBatch",
    "UnsupportedContentType",
    "WriteError",
    "decode_request",
    "is_malformed",
    "prepare",
    "content_digest",
]
