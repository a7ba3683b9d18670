"""Read a job's spool back into rows (tests, debugging, and offline analysis)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from fleetscope import codec, spool
from fleetscope.schema import record_type


def read_job(spool_dir: str | os.PathLike, job: str) -> dict[str, list[dict[str, Any]]]:
    """All records of all ranks of ``job`` under ``spool_dir``, by record type.

    Every frame is decoded and validated against the schema (``codec.conform``);
    corrupt stretches are skipped, as the agent would.
    """
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rank_dir in sorted(Path(spool_dir, spool.job_dirname(job)).glob("rank-*")):
        for seg in spool.list_segments(rank_dir):
            for frame in spool.read_frames(seg, sealed=True):
                if frame.payload is None:
                    continue
                table = codec.ipc_to_table(frame.payload)
                name = (table.schema.metadata or {}).get(b"fleetscope.record", b"").decode()
                out[name].extend(codec.conform(record_type(name), table).to_pylist())
    return dict(out)
