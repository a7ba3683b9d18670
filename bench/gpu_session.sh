#!/usr/bin/env bash
# Every check that needs a CUDA machine or a quiet many-core host, in one run, for one
# short lease of a GPU machine. Each stage has its own time limit, writes its log to
# $OUT/<stage>.log and prints its tail, so one stuck stage does not hide the others.
#
#   OUT=/tmp/gpu-session bash bench/gpu_session.sh [stage ...]
#
# Stages (default: all; the first three share a lane with the GPU, the rest run beside
# them on the CPU cores):
#   gpu_check   bench/gpu_check.py: CUDA-event timing, no syncs on the training thread,
#               hook overhead on CUDA, in-flight rows of a queued NCCL op, the reference
#               trainer on NCCL, the agent's real NVML path
#   selfcheck   bench/selfcheck_gpu.py: every probe's achieved vs datasheet figure
#   pytest_gpu  the suite's tests marked gpu (they skip on a CPU machine)
#   overhead    bench/hook_overhead.py (gloo, 4 ranks) on an otherwise idle host, + --micro
#   overhead_inter, overhead_nobg (only when named): the overhead bench with the level
#               switched per step in-process, and the same with the background thread
#               stopped (the training thread's share alone)
#   replay      bench/straggler_replay.py run: the reference trainer with and without a
#               1.2x straggler, spools packed into $OUT/replay.tar.xz for a replay anywhere
#
# It needs no install: it runs in a copy of the tree under /tmp in which fleetscope/ is
# laid out as the whole package (the machine's own python3 and torch; nothing fetched).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-session}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# A copy of the tree in which fleetscope/ is the whole package (its subpackages linked in,
# as pyproject's package-dir maps them), run from there: with the checkout itself on
# sys.path (a script's folder, `python -c` in its root, pytest's rootdir), its partial
# fleetscope/ folder would shadow any package laid out elsewhere.
SRC=$(mktemp -d /tmp/fleetscope-src.XXXX)
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./.mypy_cache --exclude=./.hypothesis --exclude='*/__pycache__' -cf - . | tar -C "$SRC" -xf -
for d in trainer_hooks trainer agent collector server dashboard kernels sim rca; do
  ln -s "../$d" "$SRC/fleetscope/$d"
done
cd "$SRC"
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}"

# the lanes' transcripts stay out of $OUT: what comes back from a lease is limited to 8 files
LANES=$(mktemp -d /tmp/gpu-session-lanes.XXXX)

log() { echo "== $* ($(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"; }
stage() {  # stage NAME LIMIT_S CMD...
  local name=$1 limit=$2
  shift 2
  log "$name (limit ${limit}s)"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "-- $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
  tail -n "${TAIL:-40}" "$OUT/$name.log"
}

log "machine"
{
  nproc; free -g | head -2; uname -r
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  "$PY" -c 'import sys, torch, numpy, pandas, pyarrow; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "pandas", pandas.__version__, "pyarrow", pyarrow.__version__)'
  "$PY" -c 'import fleetscope.trainer_hooks as h, fleetscope.kernels.suite; print("fleetscope from", h.__file__)'
} 2>&1 | tee "$OUT/machine.log"

want() { local s; for s in "${STAGES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(gpu_check selfcheck pytest_gpu overhead micro replay)
run_if() { if want "$1"; then stage "$@"; fi; }

# Two lanes at once: the GPU lane keeps one or two cores busy, the CPU lane's benches
# (4 and then 8 single-machine gloo ranks) use others of the 16, so the lease is short.
# The overhead bench compares blocks seconds apart inside one job, which cancels what
# the GPU lane adds; the replay runs after it.
(
  run_if gpu_check 200 "$PY" bench/gpu_check.py ${GPU_CHECK_ARGS:-}
  run_if selfcheck 150 "$PY" bench/selfcheck_gpu.py
  run_if pytest_gpu 120 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
    tests/test_kernels_gpu.py tests/test_trainer_hooks.py
) > "$LANES/gpu.txt" 2>&1 &
gpu_lane=$!
(
  run_if overhead 220 "$PY" bench/hook_overhead.py ${OVERHEAD_ARGS:-}
  # diagnostics of where the figure comes from (not in the default list)
  run_if overhead_inter 120 "$PY" bench/hook_overhead.py ${OVERHEAD_ARGS:-} --interleave off,full
  run_if overhead_nobg 120 "$PY" bench/hook_overhead.py ${OVERHEAD_ARGS:-} --interleave off,full --stop-worker
  run_if micro 60 "$PY" bench/hook_overhead.py --micro
  if want replay; then
    rm -rf /tmp/replay
    stage replay 200 "$PY" bench/straggler_replay.py run --out /tmp/replay ${REPLAY_ARGS:-}
    tar -C /tmp -cJf "$OUT/replay.tar.xz" --exclude='*.log' replay/spool replay/manifest.json
    ls -la "$OUT/replay.tar.xz"
  fi
) > "$LANES/cpu.txt" 2>&1
wait $gpu_lane
# the lanes' own transcripts hold only the tails; every stage's whole log is $OUT/<stage>.log
cat "$LANES/gpu.txt" "$LANES/cpu.txt"
rm -rf "$LANES"
log "done"
