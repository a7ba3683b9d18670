"""The agent's CPU priority (agent/priority.py), applied in a child process of its own.

Each case runs in a fresh interpreter: nice values and autogroups are per process and
session, and lowering them back needs privileges the suite may not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fleetscope.agent.priority import apply_nice, raise_priority

AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _child(code: str, *, new_session: bool = False, as_nobody: bool = False) -> dict:
    """Run ``code`` (which sets ``out``) in a child python; returns ``out``."""
    prog = textwrap.dedent('''
        import json, os, threading, time
        from fleetscope.agent.priority import apply_nice, raise_priority
        stop = threading.Event()
        def idle():
            stop.wait()
        before = threading.Thread(target=idle); before.start()  # running before the call
        out = {}
        if AS_NOBODY:  # root without its privileges (the interpreter is already loaded)
            os.setgid(65534); os.setuid(65534)
    ''').replace("AS_NOBODY", str(as_nobody)) + textwrap.dedent(code) + textwrap.dedent('''
        after = threading.Thread(target=idle); after.start()  # started after: inherits
        out["nices"] = {t: os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
        try:
            out["autogroup"] = open("/proc/self/autogroup").read().strip()
        except OSError:
            out["autogroup"] = None
        stop.set(); before.join(); after.join()
        print(json.dumps(out))
    ''')

    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60,
                       start_new_session=new_session)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_thread_and_later_ones_get_the_nice_value():
    out = _child('''
        res = apply_nice(7)
        out.update(threads=res.threads, denied=res.denied)
    ''')
    assert out["denied"] == ""
    assert out["threads"] >= 2  # the main thread and the one already running
    assert len(out["nices"]) >= 3 and set(out["nices"].values()) == {7}, out["nices"]


@pytest.mark.skipif(not AUTOGROUP.exists() or AUTOGROUP.read_text().strip() != "1",
                    reason="this kernel does not schedule by autogroup")
def test_a_session_leader_sets_its_autogroup_and_a_session_member_does_not():
    leader = _child('''
        res = apply_nice(6)
        out.update(group=res.autogroup)
    ''', new_session=True)
    assert leader["group"] is True and leader["autogroup"].endswith("nice 6"), leader
    member = _child('''
        res = apply_nice(6)
        out.update(group=res.autogroup)
    ''')
    # not the session leader: the autogroup is the caller's (here: pytest's), left alone
    assert member["group"] is False and set(member["nices"].values()) == {6}
    assert member["autogroup"] == Path("/proc/self/autogroup").read_text().strip()


def test_without_the_privilege_nothing_changes_and_the_reason_is_given():
    if os.geteuid() == 0:
        out = _child('''
            res = apply_nice(-5)
            out.update(threads=res.threads, group=res.autogroup, denied=res.denied)
        ''', new_session=True, as_nobody=True)
    else:
        out = _child('''
            res = apply_nice(-5)
            out.update(threads=res.threads, group=res.autogroup, denied=res.denied)
        ''', new_session=True)
        if not out["denied"]:
            pytest.skip("this user may lower nice (CAP_SYS_NICE)")
    assert out["denied"].startswith("setpriority:") and out["threads"] == 0 and not out["group"]
    assert set(out["nices"].values()) == {0}


def test_raise_priority_logs_the_refusal_once(caplog):
    out = _child('''
        import logging, io
        buf = io.StringIO()
        logging.basicConfig(level=logging.INFO, stream=buf)
        raise_priority(-3)
        out["log"] = buf.getvalue()
    ''', as_nobody=os.geteuid() == 0)
    if "CPU priority: nice -3" in out["log"]:
        pytest.skip("this user may lower nice (CAP_SYS_NICE)")
    assert out["log"].count("could not set nice -3") == 1 and "CAP_SYS_NICE" in out["log"]


def test_zero_leaves_the_priority_alone_and_bad_values_are_refused():
    assert raise_priority(0) is None
    with pytest.raises(ValueError, match="nice must be in -20..19, got 20"):
        apply_nice(20)
