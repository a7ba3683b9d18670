"""Heartbeats: every ``heartbeat_s`` one row for the host and one per local rank.

A rank row says whether the rank's process is alive (pid from ``rank.json``), the time
of its last spool record, its last step (once the process is gone, the last step in its
spool, whether or not the shipper has read it yet), the op it is blocked in right now
(from the hooks' ``inflight`` records) and up to which in-flight record the server has
acknowledged every record of the rank (``acked_through_ns``: the shipper's acknowledged
prefix, which the hang pass needs because batches may be stored out of order). A rank
that died shows ``alive = 0`` in the next heartbeat; a host whose heartbeats stop is
lost (the server's diagnosis decides).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from fleetscope.agent.config import AGENT_VERSION, node_name
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.ranks import RankRegistry, current_inflight

log = logging.getLogger("fleetscope.agent")


def local_ip(server_url: str) -> str:
    """The address this host uses to reach the server (no packet is sent)."""
    u = urlparse(server_url)
    target = u.hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, u.port or 80))
            return s.getsockname()[0]
    except OSError:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return ""


def heartbeat_rows(host: str, ip: str, node: str, num_gpus: int, ranks: RankRegistry,
                   ts_ns: int | None = None) -> list[dict[str, Any]]:
    """The rows of one heartbeat (schema ``fleetscope.schema.HEARTBEATS``)."""
    ts = ts_ns if ts_ns is not None else time.time_ns()
    base = {"ts_ns": ts, "host": host, "ip": ip, "node": node, "agent_version": AGENT_VERSION,
            "num_gpus": num_gpus}
    states = ranks.all()
    jobs = sorted({s.job for s in states if ranks.writer_alive(s)})
    rows = [{**base, "job": jobs[0] if len(jobs) == 1 else "", "rank": -1, "local_rank": -1}]
    for s in states:
        alive = ranks.writer_alive(s)
        rows.append({**base, "job": s.job, "rank": s.rank, "local_rank": s.local_rank,
                     "pid": s.pid, "alive": alive,
                     "last_record_ns": s.last_record_ns, "last_step": ranks.heartbeat_step(s, alive),
                     "inflight_op": current_inflight(s), "acked_through_ns": s.acked_through_ns})
    return rows


class Heartbeats(threading.Thread):
    """Writes a heartbeat to the outbox every ``period_s``."""

    def __init__(self, outbox: Outbox, host: str, server_url: str, ranks: RankRegistry,
                 num_gpus: Callable[[], int], stop: threading.Event, period_s: float = 2.0):
        super().__init__(name="fleetscope-heartbeats", daemon=True)
        self.outbox = outbox
        self.host = host
        self.ip = local_ip(server_url)
        self.node = node_name()
        self.ranks = ranks
        self.num_gpus = num_gpus
        self.stop_event = stop
        self.period_s = period_s
        self.num_sent = 0

    def beat(self) -> None:
        rows = heartbeat_rows(self.host, self.ip, self.node, self.num_gpus(), self.ranks)
        self.outbox.write("heartbeats", rows)
        self.num_sent += 1

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.beat()
            except Exception as e:  # never let one bad beat end the thread
                log.warning("heartbeat failed: %s", e)
            next_at += self.period_s
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
