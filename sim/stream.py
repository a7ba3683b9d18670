"""Rows over real time: what every host has to ship by a given moment, as Arrow tables.

The schedule plays a step ahead of the clock; its rows wait here until their time
(a section at its end, an op at its completion, an in-flight sample at its sample
time), as they would in the hooks' queue. Blocked ranks keep writing in-flight samples
of the op or section they are stuck in; host agents write heartbeats and GPU/host
metrics on their own periods; ranks write the hooks' self-metrics. A host that is
down writes nothing, its agent included.

:meth:`Fleet.take` returns, per record type, one table of everything due, ordered by
host, with each host's row range, so a simulated agent ships a zero-copy slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from fleetscope.agent.config import AGENT_VERSION
from fleetscope.agent.ranks import describe_inflight
from fleetscope.sim.schedule import AXES, DTYPES, OPS, SECTION_KINDS, SECTIONS, Layout, StepOut

from fleetscope.schema import RECORD_TYPES

INFLIGHT_KINDS = ("idle", "section", "collective", "p2p")
GPU_METRICS = ("gpu.utilization_pct", "gpu.memory_utilization_pct", "gpu.memory_used_bytes",
               "gpu.memory_total_bytes", "gpu.temperature_c", "gpu.power_w", "gpu.sm_clock_mhz",
               "gpu.mem_clock_mhz", "gpu.throttle_reasons", "gpu.ecc_uncorrected_volatile")
HOST_METRICS = ("host.cpu_util_pct", "host.mem_used_bytes", "host.load1")
HOOK_METRICS = ("hooks.overhead_fraction", "hooks.records_written_total",
                "hooks.dropped_records_total", "hooks.queue_len")


@dataclass(frozen=True)
class Periods:
    """Periods of the hooks' and agents' periodic records (their defaults)."""

    inflight_s: float = 0.5
    heartbeat_s: float = 2.0
    gpu_metrics_s: float = 10.0
    hook_metrics_s: float = 5.0


def _strings(values: tuple[str, ...] | list[str], codes: np.ndarray) -> pa.Array:
    """String column from dictionary codes (``-1`` -> '')."""
    d = pa.array(list(values) + [""], type=pa.string())
    c = np.where(codes < 0, len(values), codes).astype(np.int32)
    return d.take(pa.array(c))


class Fleet:
    """Pending rows of one job, released by time and cut per host."""

    def __init__(self, layout: Layout, job: str, t0_ns: int, gpus_per_host: int, host_names: list[str],
                 num_mb: int, tokens_per_step: int, periods: Periods, seed: int = 0) -> None:
        self.layout, self.job, self.t0_ns = layout, job, int(t0_ns)
        self.n = layout.topo.world_size
        self.gph, self.hosts = gpus_per_host, host_names
        self.num_hosts = len(host_names)
        self.num_mb, self.tokens = num_mb, tokens_per_step
        self.periods = periods
        self.rng = np.random.default_rng(seed + 1)
        self.host_of = (np.arange(self.n) // gpus_per_host).astype(np.int32)
        self.pending: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in (
            "sections", "collectives", "steps", "inflight")}
        self.blocked: dict[str, np.ndarray] | None = None
        self.dead = np.zeros(self.n, dtype=bool)
        self.host_dead = np.zeros(self.num_hosts, dtype=bool)
        self.last_step = np.full(self.n, -1, dtype=np.int64)
        self.last_record = np.full(self.n, -1.0)
        self.acked_through: np.ndarray | None = None
        """Per rank, the newest acknowledged in-flight time of the agents' prefix (absolute
        ns; :class:`~fleetscope.sim.agents.SimAgents` keeps it); None: not reported."""
        self.last_infl = {k: np.full(self.n, -1, dtype=t) for k, t in (
            ("kind", np.int8), ("op", np.int8), ("gidx", np.int32), ("seq", np.int64),
            ("peer", np.int32))}
        self.records_out = 0
        self.last_stage = layout.by_rank["pp"] == layout.topo.pp - 1
        self.pid = 20000 + np.arange(self.n) % 50000
        self.local_rank = (np.arange(self.n) % gpus_per_host).astype(np.int32)
        self._next = {"heartbeat": 0.0, "gpu": 1e9, "hooks": 1e9}
        self.ip = [f"10.{(h >> 16) & 255}.{(h >> 8) & 255}.{h & 255}" for h in range(self.num_hosts)]
        self.jobs_rows: list[dict] = []

    # ------------------------------------------------------------------ input
    def add_step(self, out: StepOut) -> None:
        for name, cols, rel in (("sections", out.sections, "end"), ("collectives", out.collectives, "done"),
                                ("steps", out.steps, "end"), ("inflight", out.inflight, "ts")):
            if cols["rank"].size == 0:
                continue
            rel_t = cols[rel]
            keep = np.nonzero(np.isfinite(rel_t))[0]
            idx = keep[np.argsort(rel_t[keep], kind="stable")]
            seg = {k: v[idx] for k, v in cols.items()}
            seg["_release"] = seg[rel]
            self.pending[name].append(seg)
        if out.blocked["rank"].size:
            b = out.blocked
            if self.blocked is None:
                self.blocked = b
            else:
                self.blocked = {k: np.concatenate([self.blocked[k], b[k]]) for k in b}

    def kill_ranks(self, ranks: np.ndarray) -> None:
        """These rank processes are gone (crash, job killed): no more rows of theirs."""
        self.dead[ranks] = True
        if self.blocked is not None:
            keep = ~self.dead[self.blocked["rank"]]
            self.blocked = {k: v[keep] for k, v in self.blocked.items()}

    def kill_host(self, h: int) -> None:
        self.host_dead[h] = True
        self.kill_ranks(np.nonzero(self.host_of == h)[0])

    def add_job_row(self, rel_ns: float, **row) -> None:
        self.jobs_rows.append({"ts_ns": self.t0_ns + int(rel_ns), "job": self.job, **row})

    # ------------------------------------------------------------------ output
    def take(self, now_rel: float) -> dict[str, tuple[pa.Table, np.ndarray]]:
        """Everything due by ``now_rel``: record type -> (table ordered by host, host
        row offsets of length ``num_hosts + 1``)."""
        out: dict[str, tuple[pa.Table, np.ndarray]] = {}
        for name in ("sections", "collectives", "steps", "inflight"):
            parts = []
            rest = []
            for seg in self.pending[name]:
                i = int(np.searchsorted(seg["_release"], now_rel, side="right"))
                if i:
                    parts.append({k: v[:i] for k, v in seg.items()})
                if i < seg["_release"].size:
                    rest.append({k: v[i:] for k, v in seg.items()} if i else seg)
            self.pending[name] = rest
            if name == "inflight":
                more = self._blocked_samples(now_rel)
                if more is not None:
                    parts.append(more)
            if not parts:
                continue
            cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if len(parts) > 1 else parts[0]
            alive = ~self.dead[cols["rank"]]
            if name == "inflight":
                alive &= np.isfinite(cols["ts"])
            keep = np.nonzero(alive)[0]
            if keep.size == 0:
                continue
            hosts = self.host_of[cols["rank"][keep]]
            # stable, so each host's rows stay in time order; radix sort on 16-bit keys
            order = np.argsort(hosts.astype(np.uint16) if self.num_hosts <= 1 << 16 else hosts, kind="stable")
            idx = keep[order]
            cols = {k: v[idx] for k, v in cols.items()}
            self._observe(name, cols)
            out[name] = (getattr(self, f"_{name}_table")(cols), _offsets(hosts[order], self.num_hosts))
        for name, fn in (("heartbeats", self._heartbeats), ("metrics", self._metrics)):
            got = fn(now_rel)
            if got is not None:
                out[name] = got
        if self.jobs_rows:
            rows, self.jobs_rows = self.jobs_rows, []
            h0 = int(self.host_of[0])
            t = pa.Table.from_pylist([dict(r, host=self.hosts[h0]) for r in rows])
            from fleetscope import codec

            t = codec.conform(RECORD_TYPES["jobs"], _fill_defaults("jobs", t))
            offs = np.zeros(self.num_hosts + 1, dtype=np.int64)
            offs[h0 + 1:] = t.num_rows
            out["jobs"] = (t, offs)
        self.records_out += sum(t.num_rows for t, _ in out.values())
        return out

    def _observe(self, name: str, c: dict[str, np.ndarray]) -> None:
        r = c["rank"]
        if name == "steps":
            np.maximum.at(self.last_step, r, c["step"])
        if name == "inflight":
            self.last_record[r] = np.maximum(self.last_record[r], c["ts"])
            for k in self.last_infl:  # rows are in time order: the last one wins
                self.last_infl[k][r] = c[k]

    def _blocked_samples(self, now_rel: float) -> dict[str, np.ndarray] | None:
        b = self.blocked
        if b is None or b["rank"].size == 0:
            return None
        iv = self.periods.inflight_s * 1e9
        phase = self._phase[b["rank"]]
        k_last = np.floor((now_rel - phase) / iv).astype(np.int64)
        cnt = np.maximum(0, k_last - b["next_k"] + 1)
        if not cnt.any():
            return None
        idx = np.repeat(np.arange(cnt.size), cnt)
        within = np.arange(idx.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        k = b["next_k"][idx] + within
        b["next_k"] = b["next_k"] + cnt
        ts = k * iv + phase[idx]
        since = b["since"][idx]
        out = {key: b[key][idx] for key in ("rank", "step", "kind", "op", "gidx", "axis", "seq", "peer")}
        out["ts"] = ts
        out["since"] = np.where(np.isnan(since), ts, since)
        out["_release"] = ts
        order = np.argsort(ts, kind="stable")
        return {key: v[order] for key, v in out.items()}

    _phase: np.ndarray = np.zeros(0)

    def set_phase(self, phase_ns: np.ndarray) -> None:
        self._phase = phase_ns

    # ------------------------------------------------------------------ tables
    def _abs(self, rel: np.ndarray) -> np.ndarray:
        return rel.astype(np.int64) + self.t0_ns

    def _ident(self, rank: np.ndarray) -> list:
        n = rank.size
        return [pa.array(np.full(n, 0, dtype=np.int32)), pa.array(rank.astype(np.int32)),
                _strings(self.hosts, self.host_of[rank])]

    def _job(self, n: int) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                              pa.array([self.job])).cast(pa.string())

    def _table(self, name: str, arrays: list) -> pa.Table:
        return pa.Table.from_arrays(arrays, schema=RECORD_TYPES[name].arrow_schema())

    def _sections_table(self, c: dict[str, np.ndarray]) -> pa.Table:
        n = c["rank"].size
        start, end = self._abs(c["start"]), self._abs(c["end"])
        dur = end - start
        dev = np.where(np.isin(c["name"], (1, 2, 4)), dur, -1)
        return self._table("sections", [
            self._job(n), *self._ident(c["rank"]), pa.array(c["step"]), pa.array(c["microbatch"]),
            _strings(SECTIONS, c["name"]), _strings(SECTION_KINDS, c["name"]),
            pa.array(start), pa.array(end), pa.array(dur), pa.array(dev),
            pa.nulls(n, pa.int64()).fill_null(-1)])  # cpu_ns: GPU ranks, device time instead

    def _collectives_table(self, c: dict[str, np.ndarray]) -> pa.Table:
        n = c["rank"].size
        enq, done = self._abs(c["enq"]), self._abs(c["done"])
        return self._table("collectives", [
            self._job(n), *self._ident(c["rank"]), pa.array(c["step"]), pa.array(c["microbatch"]),
            _strings(self.layout.group_names, c["gidx"]), _strings(AXES, c["axis"]),
            pa.array(c["group_rank"]), pa.array(c["group_size"]), pa.array(c["seq"]),
            _strings(OPS, c["op"]), pa.array(c["bytes"]), _strings(DTYPES, c["dtype"]),
            pa.array(c["peer"]), _strings(("completed",), np.zeros(n, dtype=np.int8)),
            pa.array(enq), pa.array(enq), pa.array(done), pa.array(done - enq)])

    def _steps_table(self, c: dict[str, np.ndarray]) -> pa.Table:
        n = c["rank"].size
        start, end = self._abs(c["start"]), self._abs(c["end"])
        loss = np.where(self.last_stage[c["rank"]],
                        2.2 + 6.0 * np.exp(-c["step"] / 400.0) + self.rng.normal(0, 0.02, n), np.nan)
        return self._table("steps", [
            self._job(n), *self._ident(c["rank"]), pa.array(c["step"]), pa.array(start),
            pa.array(end), pa.array(end - start), pa.array(np.full(n, self.num_mb, dtype=np.int32)),
            pa.array(np.full(n, self.tokens, dtype=np.int64)), pa.array(loss)])

    def _inflight_table(self, c: dict[str, np.ndarray]) -> pa.Table:
        n = c["rank"].size
        kind = c["kind"]
        op_names = np.where(kind == 1, c["op"], np.where(kind >= 2, c["op"] + len(SECTIONS), -1))
        return self._table("inflight", [
            self._job(n), *self._ident(c["rank"]), pa.array(self._abs(c["ts"])), pa.array(c["step"]),
            _strings(INFLIGHT_KINDS, kind), _strings(SECTIONS + OPS, op_names),
            _strings(self.layout.group_names, c["gidx"]), _strings(AXES, c["axis"]),
            pa.array(c["seq"]), pa.array(c["peer"]), pa.array(self._abs(c["since"]))])

    # ------------------------------------------------------------------ agents
    def _due(self, what: str, now_rel: float, period_s: float) -> bool:
        if now_rel < self._next[what]:
            return False
        self._next[what] = max(self._next[what] + period_s * 1e9, now_rel)
        return True

    def _heartbeats(self, now_rel: float) -> tuple[pa.Table, np.ndarray] | None:
        if not self._due("heartbeat", now_rel, self.periods.heartbeat_s):
            return None
        up = np.nonzero(~self.host_dead)[0]
        if up.size == 0:
            return None
        ranks = np.nonzero(~self.host_dead[self.host_of])[0]
        ts = self.t0_ns + int(now_rel)
        # per host: its row (rank -1) then its ranks' rows
        h_rows = np.concatenate([up, self.host_of[ranks]])
        r_rows = np.concatenate([np.full(up.size, -1), ranks])
        order = np.lexsort((r_rows, h_rows))
        h_rows, r_rows = h_rows[order], r_rows[order]
        n = h_rows.size
        is_rank = r_rows >= 0
        rr = np.where(is_rank, r_rows, 0)
        li = self.last_infl
        desc = np.full(n, "", dtype=object)
        kinds = li["kind"][rr]
        for i in np.nonzero(is_rank & (kinds > 0) & ~self.dead[rr])[0]:
            r = rr[i]
            k = int(kinds[i])
            op = SECTIONS[li["op"][r]] if k == 1 else OPS[li["op"][r]]
            gid = self.layout.group_names[li["gidx"][r]] if li["gidx"][r] >= 0 else ""
            desc[i] = describe_inflight(INFLIGHT_KINDS[k], op, gid, int(li["seq"][r]), int(li["peer"][r]))
        last_rec = np.where(is_rank & (self.last_record[rr] >= 0), self._abs(np.maximum(self.last_record[rr], 0)), -1)
        t = self._table("heartbeats", [
            pa.array(np.full(n, ts, dtype=np.int64)), self._job(n), _strings(self.hosts, h_rows),
            pa.array(r_rows.astype(np.int32)), pa.array(np.where(is_rank, self.local_rank[rr], -1).astype(np.int32)),
            _strings(self.ip, h_rows), _strings(self.hosts, h_rows),
            _strings((AGENT_VERSION,), np.zeros(n, dtype=np.int8)),
            pa.array(np.full(n, self.gph, dtype=np.int32)),
            pa.array(np.where(is_rank, self.pid[rr], -1).astype(np.int32)),
            pa.array(np.where(is_rank, ~self.dead[rr], True).astype(np.uint8)),
            pa.array(last_rec.astype(np.int64)),
            pa.array(np.where(is_rank, self.last_step[rr], -1).astype(np.int64)),
            pa.array(desc.tolist(), type=pa.string()),
            pa.array(self._acked_through(rr, is_rank))])
        return t, _offsets(h_rows, self.num_hosts)

    def _acked_through(self, rr: np.ndarray, is_rank: np.ndarray) -> np.ndarray:
        """Heartbeat ``acked_through_ns``: the agents' acknowledged prefix per rank
        (:attr:`acked_through`, set by whoever ships the records), -1 for host rows and
        when nothing ships through agents."""
        acked = self.acked_through
        if acked is None:
            return np.full(rr.size, -1, dtype=np.int64)
        return np.where(is_rank, acked[rr], -1).astype(np.int64)

    def _metrics(self, now_rel: float) -> tuple[pa.Table, np.ndarray] | None:
        gpu = self._due("gpu", now_rel, self.periods.gpu_metrics_s)
        hooks = self._due("hooks", now_rel, self.periods.hook_metrics_s)
        if not (gpu or hooks):
            return None
        ts = self.t0_ns + int(now_rel)
        parts: list[tuple[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]] = []
        # (host idx, rank, source code, device code, name code, value)
        names = GPU_METRICS + HOST_METRICS + HOOK_METRICS
        ranks = np.nonzero(~self.dead & ~self.host_dead[self.host_of])[0]
        if gpu and ranks.size:
            busy = np.where(self.last_infl["kind"][ranks] >= 0, 1.0, 0.0)
            vals = {
                "gpu.utilization_pct": np.clip(busy * (93 + self.rng.normal(0, 2, ranks.size)), 0, 100),
                "gpu.memory_utilization_pct": np.clip(busy * (55 + self.rng.normal(0, 5, ranks.size)), 0, 100),
                "gpu.memory_used_bytes": np.full(ranks.size, 71.0e9) + self.rng.normal(0, 1e8, ranks.size),
                "gpu.memory_total_bytes": np.full(ranks.size, 80.0e9),
                "gpu.temperature_c": 62 + 6 * busy + self.rng.normal(0, 1.5, ranks.size),
                "gpu.power_w": 120 + 520 * busy + self.rng.normal(0, 15, ranks.size),
                "gpu.sm_clock_mhz": np.full(ranks.size, 1980.0),
                "gpu.mem_clock_mhz": np.full(ranks.size, 2619.0),
                "gpu.throttle_reasons": np.zeros(ranks.size),
                "gpu.ecc_uncorrected_volatile": np.zeros(ranks.size),
            }
            for name, v in vals.items():
                parts.append((self.host_of[ranks], ranks, 0, self.local_rank[ranks], np.full(ranks.size, names.index(name)), v))
            up = np.nonzero(~self.host_dead)[0]
            hv = {"host.cpu_util_pct": 20 + self.rng.normal(0, 3, up.size),
                  "host.mem_used_bytes": 6.1e11 + self.rng.normal(0, 1e9, up.size),
                  "host.load1": 14 + self.rng.normal(0, 1, up.size)}
            for name, v in hv.items():
                parts.append((up, np.full(up.size, -1), 1, np.full(up.size, -1), np.full(up.size, names.index(name)), v))
        if hooks and ranks.size:
            written = np.maximum(0, self.last_step[ranks]) * 60.0
            hv = {"hooks.overhead_fraction": np.abs(self.rng.normal(0.002, 0.0003, ranks.size)),
                  "hooks.records_written_total": written,
                  "hooks.dropped_records_total": np.zeros(ranks.size),
                  "hooks.queue_len": np.abs(self.rng.normal(20, 5, ranks.size)).round()}
            for name, v in hv.items():
                parts.append((self.host_of[ranks], ranks, 2, np.full(ranks.size, -1), np.full(ranks.size, names.index(name)), v))
        if not parts:
            return None
        h = np.concatenate([p[0] for p in parts])
        r = np.concatenate([p[1] for p in parts])
        src = np.concatenate([np.full(p[0].size, p[2]) for p in parts])
        dev = np.concatenate([p[3] for p in parts])
        nm = np.concatenate([p[4] for p in parts])
        val = np.concatenate([p[5] for p in parts]).astype(np.float64)
        order = np.argsort(h, kind="stable")
        h, r, src, dev, nm, val = h[order], r[order], src[order], dev[order], nm[order], val[order]
        n = h.size
        t = self._table("metrics", [
            pa.array(np.full(n, ts, dtype=np.int64)), self._job(n), _strings(self.hosts, h),
            pa.array(r.astype(np.int32)), _strings(("gpu", "host", "hooks"), src),
            _strings([f"gpu{i}" for i in range(self.gph)], dev), _strings(names, nm), pa.array(val)])
        return t, _offsets(h, self.num_hosts)


def _offsets(sorted_hosts: np.ndarray, num_hosts: int) -> np.ndarray:
    return np.searchsorted(sorted_hosts, np.arange(num_hosts + 1), side="left").astype(np.int64)


def _fill_defaults(name: str, t: pa.Table) -> pa.Table:
    rt = RECORD_TYPES[name]
    for c in rt.columns:
        if c.name not in t.column_names:
            t = t.append_column(c.name, pa.array([c.default] * t.num_rows))
    return t.select(list(rt.column_names))
