"""Per rank per step time breakdown and collective arrival analysis (pure pandas).

Inputs are frames with the columns of the schema tables ``sections``, ``collectives``
and ``steps`` (any extra columns are ignored). Two facts drive the arithmetic:

* a section (e.g. ``forward``) may contain collectives (TP all-reduce inside a layer),
  and on CPU a collective's duration includes *waiting for peers*; so a section's own
  work is its duration minus the communication nested in it;
* who everyone waits for is read from ``enqueued_ns`` of the same ``(group_id, seq)``
  across the group's members (the last to arrive is the one waited for); for p2p the
  k-th send from A to B is matched with the k-th receive at B from A.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

P2P_OPS = frozenset({"send", "recv", "isend", "irecv"})
P2P_OP_QUANTILE = 0.75
"""The typical receive of a pipeline group's step (:func:`group_transfer`): its upper quartile."""
BREAKDOWN_COLUMNS = (
    "rank",
    "step",
    "step_ns",
    "comm_ns",
    "wait_ns",
    "busy_ns",
    "compute_ns",
    "dataloader_ns",
    "optimizer_ns",
    "other_ns",
    "untimed_ns",
    "compute_cpu_ns",
    "optimizer_cpu_ns",
    "wait_caused_ns",
    "num_last_arrivals",
    "num_collectives",
)


def top_level_sections(sections: pd.DataFrame) -> pd.DataFrame:
    """Drop sections nested inside another section of the same rank (no double counting)."""
    if sections.empty:
        return sections
    s = sections.sort_values(["rank", "start_ns", "end_ns"], ascending=[True, True, False])
    prev_max_end = s.groupby("rank")["end_ns"].cummax().groupby(s["rank"]).shift(1)
    nested = prev_max_end.notna() & (s["end_ns"] <= prev_max_end)
    return s[~nested.to_numpy()]


def exclusive_comm_ns(comm: pd.DataFrame) -> np.ndarray:
    """Per op, the part of its [enqueued, completed] interval not covered by earlier ops of
    the same rank: summed, it is the union of the rank's communication time, so paired
    or overlapping async ops (isend + irecv) are not counted twice."""
    out = np.zeros(len(comm), dtype=np.int64)
    if comm.empty:
        return out
    order = np.lexsort((comm["enqueued_ns"].to_numpy(), comm["rank"].to_numpy()))
    rank = comm["rank"].to_numpy()[order]
    start = comm["enqueued_ns"].to_numpy()[order].astype(np.int64)
    end = np.maximum(start + comm["comm_ns"].to_numpy()[order].astype(np.int64), start)
    excl = np.zeros(len(order), dtype=np.int64)
    prev_rank, covered = None, np.iinfo(np.int64).min
    for i in range(len(order)):
        if rank[i] != prev_rank:
            prev_rank, covered = rank[i], np.iinfo(np.int64).min
        excl[i] = max(0, end[i] - max(start[i], covered))
        covered = max(covered, end[i])
    out[order] = excl
    return out


def nested_comm_ns(sections: pd.DataFrame, comm: pd.DataFrame) -> np.ndarray:
    """Communication time (union of op intervals) of ops that start inside each section."""
    out = np.zeros(len(sections), dtype=np.int64)
    if sections.empty or comm.empty:
        return out
    pos = pd.Series(np.arange(len(sections)), index=sections.index)
    comm_by_rank = {r: g for r, g in comm.groupby("rank")}
    for rank, sec in sections.groupby("rank"):
        c = comm_by_rank.get(rank)
        if c is None:
            continue
        c = c.sort_values("enqueued_ns")
        enq = c["enqueued_ns"].to_numpy()
        cs = np.concatenate([[0], np.cumsum(c["excl_ns"].to_numpy())])
        lo = np.searchsorted(enq, sec["start_ns"].to_numpy(), side="left")
        hi = np.searchsorted(enq, sec["end_ns"].to_numpy(), side="left")
        out[pos[sec.index].to_numpy()] = cs[hi] - cs[lo]
    return out


def collective_arrivals(collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per completed op per rank with arrival lateness, wait and transfer time.

    Columns added: ``comm_ns`` (completed - enqueued), ``last_arrival_ns`` (when the last
    member/peer arrived), ``wait_ns`` (time this rank waited for others), ``lateness_ns``
    (how late this rank arrived vs the group's median arrival; for p2p vs its peer),
    ``is_last`` (this rank was the one waited for), ``transfer_ns`` (completion minus the
    last arrival: the time the link itself took), ``waited_on_rank``.
    """
    cols = [
        "rank", "step", "microbatch", "group_id", "axis", "seq", "op", "bytes", "dtype",
        "peer", "enqueued_ns", "completed_ns",
    ]
    if collectives.empty:
        return pd.DataFrame(columns=cols + ["comm_ns", "last_arrival_ns", "wait_ns",
                                            "lateness_ns", "is_last", "transfer_ns",
                                            "waited_on_rank", "excl_ns"])
    c = collectives
    if "state" in c.columns:
        c = c[c["state"] == "completed"]
    c = c[c["completed_ns"] >= 0][[x for x in cols if x in c.columns]].copy()
    c["comm_ns"] = (c["completed_ns"] - c["enqueued_ns"]).clip(lower=0)
    is_p2p = c["op"].isin(P2P_OPS)
    coll = _collective_part(c[~is_p2p])
    p2p = _p2p_part(c[is_p2p])
    out = pd.concat([x for x in (coll, p2p) if not x.empty] or [coll], ignore_index=True)
    out["excl_ns"] = exclusive_comm_ns(out)
    return out


def _collective_part(c: pd.DataFrame) -> pd.DataFrame:
    if c.empty:
        return c.assign(last_arrival_ns=[], wait_ns=[], lateness_ns=[], is_last=[],
                        transfer_ns=[], waited_on_rank=[])
    g = c.groupby(["group_id", "seq"])
    last = g["enqueued_ns"].transform("max")
    med = g["enqueued_ns"].transform("median")
    first_done = g["completed_ns"].transform("min")
    n = g["rank"].transform("size")
    idx_last = g["enqueued_ns"].transform("idxmax")
    c = c.assign(
        last_arrival_ns=last,
        wait_ns=np.minimum(last - c["enqueued_ns"], c["comm_ns"]),
        lateness_ns=(c["enqueued_ns"] - med).where(n > 1, 0),
        is_last=(c.index == idx_last) & (n > 1),
        transfer_ns=(first_done - last).clip(lower=0),
        waited_on_rank=c.loc[idx_last.to_numpy(), "rank"].to_numpy(),
    )
    return c


def _p2p_part(c: pd.DataFrame) -> pd.DataFrame:
    if c.empty:
        return c
    c = c.assign(is_send=c["op"].isin({"send", "isend"}))
    c["src"] = np.where(c["is_send"], c["rank"], c["peer"])
    c["dst"] = np.where(c["is_send"], c["peer"], c["rank"])
    c = c.sort_values("enqueued_ns")
    c["k"] = c.groupby(["step", "src", "dst", "is_send"]).cumcount()
    key = ["step", "src", "dst", "k"]
    sends, recvs = c[c["is_send"]], c[~c["is_send"]]
    other_s = sends[key + ["enqueued_ns"]].rename(columns={"enqueued_ns": "other_enq"})
    other_r = recvs[key + ["enqueued_ns"]].rename(columns={"enqueued_ns": "other_enq"})
    out = pd.concat(
        [sends.merge(other_r, on=key, how="left"), recvs.merge(other_s, on=key, how="left")],
        ignore_index=True,
    )
    other = out["other_enq"].fillna(out["enqueued_ns"])
    last = np.maximum(out["enqueued_ns"], other)
    out["last_arrival_ns"] = last
    out["wait_ns"] = np.minimum((last - out["enqueued_ns"]).clip(lower=0), out["comm_ns"])
    out["lateness_ns"] = out["enqueued_ns"] - other
    out["is_last"] = out["enqueued_ns"] > other
    out["transfer_ns"] = (out["completed_ns"] - last).clip(lower=0)
    out["waited_on_rank"] = np.where(out["is_last"], out["rank"], out["peer"])
    return out.drop(columns=["src", "dst", "k", "other_enq", "is_send"])


def rank_step_breakdown(
    sections: pd.DataFrame, collectives: pd.DataFrame, steps: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time breakdown per (rank, step) and the arrival frame it was computed from.

    ``busy_ns`` = step time minus all communication time: the rank's own work, including
    time in no timed section (``untimed_ns``). Section columns are net of nested comm.
    ``wait_caused_ns`` sums how long peers waited for this rank (it arrived last).
    """
    arr = collective_arrivals(collectives)
    if steps.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS), arr
    st = steps.groupby(["rank", "step"], as_index=False).agg(
        step_ns=("duration_ns", "max"), start_ns=("start_ns", "min"))
    out = st.set_index(["rank", "step"])
    if not arr.empty:
        agg = arr.groupby(["rank", "step"]).agg(
            comm_ns=("excl_ns", "sum"), wait_ns=("wait_ns", "sum"),
            num_collectives=("comm_ns", "size"))
        out = out.join(agg)
        # time peers spent waiting for this rank, credited to the rank waited on
        caused = arr[~arr["is_last"].astype(bool) & (arr["wait_ns"] > 0)]
        wc = caused.groupby(["waited_on_rank", "step"])["wait_ns"].sum()
        wc.index = wc.index.set_names(["rank", "step"])
        out = out.join(wc.rename("wait_caused_ns"))
        nl = arr[arr["is_last"].astype(bool)].groupby(["rank", "step"]).size()
        out = out.join(nl.rename("num_last_arrivals"))
    if not sections.empty:
        sec = top_level_sections(sections)
        net = sec["duration_ns"].to_numpy() - nested_comm_ns(sec, arr)
        sec = sec.assign(net_ns=np.maximum(net, 0))
        kinds = sec.pivot_table(index=["rank", "step"], columns="kind", values="net_ns",
                                aggfunc="sum")
        for kind in ("compute", "dataloader", "optimizer", "other"):
            if kind in kinds.columns:
                out = out.join(kinds[kind].rename(f"{kind}_ns"))
        if "cpu_ns" in sec.columns:  # the compute and optimizer sections' thread CPU time, where measured
            for kind in ("compute", "optimizer"):
                cpu = sec[(sec["kind"] == kind) & (sec["cpu_ns"] >= 0)]
                if not cpu.empty:
                    out = out.join(cpu.groupby(["rank", "step"])["cpu_ns"].sum().rename(f"{kind}_cpu_ns"))
    for col in BREAKDOWN_COLUMNS[2:]:
        if col not in out.columns:
            out[col] = 0
    out = out.fillna(0)
    out["busy_ns"] = (out["step_ns"] - out["comm_ns"]).clip(lower=0)
    timed = out["compute_ns"] + out["dataloader_ns"] + out["optimizer_ns"] + out["other_ns"]
    out["untimed_ns"] = (out["busy_ns"] - timed).clip(lower=0)
    out = out.reset_index()
    return out[list(BREAKDOWN_COLUMNS)].astype({c: "int64" for c in BREAKDOWN_COLUMNS}), arr


def group_transfer(arr: pd.DataFrame) -> pd.DataFrame:
    """Per (group_id, axis, step): link time (completion - last arrival) of the group's ops.

    Each op counts once per group (its minimum over members). ``transfer_ns`` is the sum
    over the step's ops, ``num_ops`` the number of ops, ``op_transfer_ns`` the typical op:
    the median (robust to a descheduled process stretching one op), or where every op of
    the group's step is a point-to-point receive, the upper quartile (``P2P_OP_QUANTILE``).
    A receive's link time shows only where its sender posted first: a slow pipeline link
    whose receiver posted late hides in that wait, and of a step's 8 receives only the
    3-4 posted early showed it (20 ms delay, bench 2026-12-07), which their median hid.
    """
    cols = ["group_id", "axis", "step", "transfer_ns", "op_transfer_ns", "num_ops", "bytes"]
    if arr.empty:
        return pd.DataFrame(columns=cols)
    if "op_transfer_ns" in arr.columns:  # already reduced per group and step (reduced_arrivals)
        return arr.assign(transfer_ns=arr["gt_transfer_ns"])[cols].reset_index(drop=True)
    is_p2p = arr["op"].isin(P2P_OPS)
    coll = arr[~is_p2p].groupby(["group_id", "axis", "step", "seq"], as_index=False).agg(
        transfer_ns=("transfer_ns", "min"), bytes=("bytes", "max"))
    p2p = arr[is_p2p & arr["op"].isin({"recv", "irecv"})]
    p2p = p2p[["group_id", "axis", "step", "seq", "transfer_ns", "bytes"]]
    both = pd.concat([x.assign(coll=float(x is coll)) for x in (coll, p2p) if not x.empty] or [coll.assign(coll=1.0)],
                     ignore_index=True)
    g = both.groupby(["group_id", "axis", "step"], as_index=False)
    out = g.agg(transfer_ns=("transfer_ns", "sum"), op_transfer_ns=("transfer_ns", "median"),
                num_ops=("transfer_ns", "size"), bytes=("bytes", "sum"), coll=("coll", "max"))
    if (out["coll"] == 0).any():  # some group's step is all receives: its upper quartile
        upper = g["transfer_ns"].quantile(P2P_OP_QUANTILE)["transfer_ns"].to_numpy()
        out["op_transfer_ns"] = np.where(out["coll"] == 0, upper, out["op_transfer_ns"])
    return out[cols]


def reduced_arrivals(groups: pd.DataFrame) -> pd.DataFrame:
    """An arrivals frame of one row per ``(group_id, axis, step)``, from the reductions
    ClickHouse made (:data:`.rollups.GROUP_STEP_SQL`), for the detectors that read link
    times from arrivals: :func:`group_transfer` returns its rows as they are, and
    ``whatif.profile_from_frames`` sums ``transfer_ns`` (its per-op minimum, summed per
    group and step) exactly as over per-op rows. It holds no per-rank rows (``rank`` -1):
    the per-rank arrival figures are in the reduced breakdown."""
    cols = ["group_id", "axis", "step", "seq", "op", "transfer_ns", "gt_transfer_ns", "op_transfer_ns",
            "num_ops", "bytes", "rank", "is_last", "lateness_ns", "wait_ns", "waited_on_rank",
            "enqueued_ns", "excl_ns", "comm_ns"]
    if groups is None or groups.empty:
        return pd.DataFrame(columns=cols)
    n = len(groups)
    return pd.DataFrame({
        "group_id": groups["group_id"].to_numpy(), "axis": groups["axis"].to_numpy(),
        "step": groups["step"].to_numpy(), "seq": np.zeros(n, dtype=np.int64), "op": "all_reduce",
        "transfer_ns": groups["transfer_ns"].to_numpy(dtype=np.int64),
        "gt_transfer_ns": groups["gt_transfer_ns"].to_numpy(dtype=np.int64),
        "op_transfer_ns": groups["op_transfer_ns"].to_numpy(dtype=float),
        "num_ops": groups["num_ops"].to_numpy(dtype=np.int64), "bytes": groups["bytes"].to_numpy(dtype=np.int64),
        "rank": -1, "is_last": False, "lateness_ns": 0.0, "wait_ns": 0, "waited_on_rank": -1,
        "enqueued_ns": -1, "excl_ns": 0, "comm_ns": 0,
    })[cols]
