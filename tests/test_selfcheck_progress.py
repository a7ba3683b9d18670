"""``fleetscope selfcheck`` shows a rich progress bar when stderr is a terminal (a real
pseudo-terminal here) and stays plain ``[selfcheck] ...`` lines when stderr is a pipe;
stdout (the JSON records) is the same either way. Real processes: the CLI and its
2-rank gloo group for the all-reduce probe."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

pytest.importorskip("rich")

ARGS = [sys.executable, "-m", "fleetscope.cli", "selfcheck", "--device", "cpu", "--host", "pty-host",
        "--probes", "membw,numerics,allreduce", "--nprocs", "2", "--output", "json"]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    e.update(COLUMNS="120", TERM="xterm-256color")
    e.pop("NO_COLOR", None)
    return e


def run_with_tty_stderr(timeout_s: float = 240) -> tuple[int, str, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(ARGS, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env())
    os.close(slave)
    err = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                err += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read().decode()
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return rc, out, err.decode(errors="replace")


def test_selfcheck_draws_a_bar_on_a_terminal_and_plain_lines_on_a_pipe():
    rc, out, err = run_with_tty_stderr()
    assert rc == 0, err[-3000:]
    probes = [json.loads(line)["probe"] for line in out.splitlines()]
    assert sorted(set(probes)) == ["allreduce", "membw", "numerics"], out
    # rich's bar: the bar glyphs and the completed stage count (membw x kernels + numerics + group)
    assert "━" in err, err[-3000:]
    assert "\x1b[" in err  # drawn with terminal control sequences
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)
    counts = [(int(a), int(b)) for a, b in re.findall(r"selfcheck [━╺╸ ]+ (\d+)/(\d+)", text)]
    assert counts and counts[-1][0] == counts[-1][1] >= 3, counts  # membw kernels + numerics + the group
    assert any(0 < a < b for a, b in counts), counts  # it moved through the stages
    # the ranks' lines still reach the terminal, above the bar, not torn by it
    assert "rank 0: allreduce" in err
    assert "3/3 probe results passed" in err or "probe results passed on pty-host" in err

    plain = subprocess.run(ARGS, capture_output=True, text=True, timeout=240, env=env())
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert [json.loads(line)["probe"] for line in plain.stdout.splitlines()] == probes
    assert "━" not in plain.stderr and "\x1b[" not in plain.stderr
    lines = plain.stderr.splitlines()
    assert all(line.startswith("[selfcheck] ") for line in lines[:-1]), lines
    assert any("rank 0: allreduce" in line for line in lines)
