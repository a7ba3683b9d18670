"""Spool retention and the disk budget.

Policy (documented in the README, section "The agent"):

1. A segment is deleted only when it is *sealed* (a newer segment exists, or its
   writer is gone) and *fully acknowledged* (the durable offset reached its end).
   By default that happens at once; with ``retain_acked`` acked segments stay on disk
   until the budget needs their space.
2. With a disk budget (``--disk-budget``), whenever the spool (all segments, the
   agent's outbox included) is larger than the budget, acked sealed segments are
   deleted **oldest first** (by modification time) until it fits.
3. If only unacknowledged data is left and the spool is above ``warn_fraction``
   (90 %) of the budget, the agent logs a loud warning (at most every 30 s) naming
   the backlog, and counts it; nothing is deleted yet.
4. Above the budget with only unacked data left:
   * policy ``keep`` (default): nothing unacked is ever deleted; the agent logs an
     error at most every 30 s. The writer is never blocked by the agent (it is another
     process); the disk fills as it would without fleetscope.
   * policy ``drop-oldest``: the oldest *sealed* unacked segments are deleted until the
     spool fits; every deletion is logged as an error, counted
     (``agent.dropped_unacked_bytes``) and shipped as a ``log_events`` row. Never
     deleted: the segment a writer is appending to, and the files of the pending
     batches (those in flight and those acked beyond an unacked one: at most
     4 x ``--in-flight`` batches of ``--batch-bytes``; a restarted agent must re-send
     them under their keys), so keep the budget well above that.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.tailer import Segment

log = logging.getLogger("fleetscope.agent")
WARN_EVERY_S = 30.0


@dataclass
class RetentionStats:
    deleted_acked_segments: int = 0
    deleted_acked_bytes: int = 0
    dropped_unacked_segments: int = 0
    dropped_unacked_bytes: int = 0
    budget_warnings: int = 0
    spool_bytes: int = 0
    unacked_bytes: int = 0


class Retention:
    """Applies the policy above to a list of segments."""

    def __init__(self, offsets: OffsetStore, budget_bytes: int | None = None,
                 policy: str = "keep", retain_acked: bool = False, warn_fraction: float = 0.9,
                 on_drop: Callable[[Segment, int], None] | None = None):
        self.offsets = offsets
        self.budget_bytes = budget_bytes
        self.policy = policy
        self.retain_acked = retain_acked
        self.warn_fraction = warn_fraction
        self.on_drop = on_drop
        self.stats = RetentionStats()
        self._last_warn = 0.0

    def acked(self, seg: Segment) -> int:
        return self.offsets.offset(seg.key, seg.ino)

    def apply(self, segs: list[Segment], busy: set[str] | frozenset[str] = frozenset()) -> list[Segment]:
        """Delete what the policy says; returns the segments still on disk.

        ``busy`` names the files of the pending batches (never dropped unacked: a
        restarted agent must be able to re-send them under their keys).
        """
        keep: list[Segment] = []
        deletable: list[Segment] = []
        for s in segs:
            if s.sealed and self.acked(s) >= s.size:
                deletable.append(s)
            else:
                keep.append(s)
        if not self.retain_acked:
            for s in deletable:
                self._delete(s, acked=True)
            deletable = []
        total = sum(s.size for s in keep) + sum(s.size for s in deletable)
        unacked = sum(max(0, s.size - self.acked(s)) for s in keep)
        self.stats.unacked_bytes = unacked
        if self.budget_bytes is None:
            self.stats.spool_bytes = total
            return keep + deletable
        deletable.sort(key=lambda s: s.mtime_ns)
        while total > self.budget_bytes and deletable:
            s = deletable.pop(0)
            self._delete(s, acked=True)
            total -= s.size
        keep += deletable
        if total > self.warn_fraction * self.budget_bytes:
            self._warn_budget(total, unacked)
        if total > self.budget_bytes and self.policy == "drop-oldest":
            victims = sorted((s for s in keep if s.sealed and s.key not in busy),
                             key=lambda s: s.mtime_ns)
            for s in victims:
                if total <= self.budget_bytes:
                    break
                lost = max(0, s.size - self.acked(s))
                self._delete(s, acked=False, lost=lost)
                keep.remove(s)
                total -= s.size
        self.stats.spool_bytes = total
        return keep

    def _warn_budget(self, total: int, unacked: int) -> None:
        now = time.monotonic()
        if now - self._last_warn < WARN_EVERY_S:
            return
        self._last_warn = now
        self.stats.budget_warnings += 1
        pct = 100.0 * total / self.budget_bytes if self.budget_bytes else 0.0
        if total > (self.budget_bytes or 0):
            action = ("deleting the oldest sealed unacknowledged segments (policy drop-oldest)"
                      if self.policy == "drop-oldest"
                      else "keeping all unacknowledged data (policy keep); the disk will fill")
            log.error("SPOOL OVER DISK BUDGET: %d of %d bytes (%.0f%%), %d bytes not yet "
                      "acknowledged by the server; %s", total, self.budget_bytes, pct, unacked,
                      action)
        else:
            log.warning("SPOOL NEAR DISK BUDGET: %d of %d bytes (%.0f%%), %d bytes not yet "
                        "acknowledged; at 100%% %s", total, self.budget_bytes, pct, unacked,
                        "the oldest unacknowledged segments will be deleted"
                        if self.policy == "drop-oldest" else "an error is logged, nothing deleted")

    def _delete(self, s: Segment, acked: bool, lost: int = 0) -> None:
        try:
            os.unlink(s.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("cannot delete spool segment %s: %s", s.path, e)
            return
        self.offsets.forget(s.key)
        if acked:
            self.stats.deleted_acked_segments += 1
            self.stats.deleted_acked_bytes += s.size
            return
        self.stats.dropped_unacked_segments += 1
        self.stats.dropped_unacked_bytes += lost
        self.offsets.add_counters({"dropped_unacked_bytes": lost, "dropped_unacked_segments": 1})
        log.error("DISK BUDGET: deleted unacknowledged spool segment %s (%d bytes never shipped)",
                  s.key, lost)
        if self.on_drop is not None:
            self.on_drop(s, lost)
