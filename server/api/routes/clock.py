"""``GET /api/v1/clock``: the server's clock for NTP-style offset estimation by agents."""

from __future__ import annotations

import time

from fastapi import APIRouter
from pydantic import BaseModel

router = APIRouter(tags=["clock"])


class ClockPublic(BaseModel):
    receive_ns: int
    """Server time (ns since the epoch) when the request reached the handler."""
    send_ns: int
    """Server time just before the response is returned."""


@router.get("/clock", response_model=ClockPublic, summary="Server clock for agent clock alignment")
async def get_clock() -> ClockPublic:
    """Return the server's receive and send timestamps (see ``fleetscope.agent.clock``)."""
    receive_ns = time.time_ns()
    return ClockPublic(receive_ns=receive_ns, send_ns=time.time_ns())
