#!/usr/bin/env bash
# The executor's device check as ONE command, for a session that has the GPU machine
# (/work/.library/device/README.md). Through the `run` tool, from the repository root:
#
#     run(command="bash scripts/gpu_check.sh", timeout_s=600)
#
# Writes $OUT/gpu_check_cuda.md + .json (the report), $OUT/gpu_check_cuda.log (stdout/stderr) and
# $OUT/gpu_check_env.txt (versions). Outside the device machine OUT defaults to reports/.
#
# Which Python: the device image's own `python3` (seen 2026-11 as /opt/torch/.venv/bin/python3
# with torch 2.11.0+cu130, triton 3.6.0, transformers 5.17.0; override with PYTHON=...). NOT this
# repo's .venv: it is git-ignored (does not travel) and holds a CPU torch 2.13 build. And no
# `pip install -e .[executor]`: the machine reaches no package registry, so pip could only fail or,
# worse, replace the image's CUDA torch. The check imports torch, triton, transformers and the
# checkout's own pagesim.core (stdlib only) / executor through PYTHONPATH, nothing else.
# Uncertain until a first run: those versions differ from the ones the kernels were developed
# with here (triton 3.9, transformers 5.24); the env file and the report's header record what was
# found, and section 1 fails loudly (per section, the others still run) if a kernel does not
# compile.
#
# Timing: the script budgets itself to ~470 s (--budget-s) and shrinks its open-ended parts to
# fit; `timeout` below (540 s, SIGTERM then SIGKILL 20 s later) is the backstop, inside the tool's
# 600 s. On SIGTERM the Python side records the section in progress and writes the report.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-reports}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset TRITON_INTERPRET PAGESIM_KERNELS

{
  echo "== $(date -u +%FT%TZ) $(uname -m)"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
  "$PY" -c "import sys, torch; print(sys.executable, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cuda available', torch.cuda.is_available())"
  "$PY" -c "import triton, transformers; print('triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/gpu_check_env.txt"

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "torch.cuda.is_available() is False for $PY: no CUDA build of torch here, not running" | tee -a "$OUT/gpu_check_env.txt"
  exit 3
fi

timeout -k 20 540 "$PY" -m pagesim.experiments.gpu_check --device cuda --out "$OUT/gpu_check_cuda.md" 2>&1 | tee "$OUT/gpu_check_cuda.log"
rc=${PIPESTATUS[0]}
echo "gpu_check exit status $rc (0: every section ok; 1: a section failed or was cut; 124/137: outer timeout)"
exit "$rc"
