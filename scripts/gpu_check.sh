#!/usr/bin/env bash
# The GPU check, prepared on a CPU machine and run on a lent GPU machine. It writes under $OUT (default
# /tmp/gpu_check) at most eight files: the device, the CUDA tests, one minute of the default run and its metrics.json,
# the speed table at each size, the fast tier with every training run on CUDA, and summary.txt (each step's exit).
#
#   bash scripts/gpu_check.sh                          # the repository's requirements already importable
#   WHEELS=.whl BUDGET=540 bash scripts/gpu_check.sh   # first install the wheels in .whl/; all steps in 540 s
#
# Steps run in this order, correctness first: device, cuda_tests, fast_tier_on_cuda, one_minute, bench (each size
# a step; a fresh process per row and round, so a row with compile spends minutes compiling first). On an H200 with
# a 15-minute lease the machine started in about 35 s; cuda_tests took 61 s, the fast tier 90 s, one_minute 89 s,
# and six bench rows at 64 px about 100 s at 300 steps, the compile row more than 90 s on its own.
#   STEPS="cuda_tests bench" SIZES=64 ROUNDS=1 BENCH_STEPS=300 bash scripts/gpu_check.sh   # some steps, shorter
#
# BUDGET: seconds for every step together; each step gets at most its own limit and what is left, so a slow step
# leaves the later ones less, never the whole call overrun. A step stopped at its limit gets SIGINT first (pytest
# then prints its summary). A failed step does not stop the later ones. The bench runs 500 steps a row: on a GPU a
# step takes milliseconds, and fewer would charge the one checkpoint at the end to too few of them.
#
# A machine with no network but its own torch needs only what its image lacks (hydra-core, omegaconf,
# antlr4-python3-runtime, filelock >= 4, torch-fidelity, at constraints.txt's versions): on a machine with pip,
#   bash scripts/gpu_check.sh --wheels      # PY's pip fills .whl/ for CPython 3.12 on x86-64 (WHEELS_PY=3.11, ...)
# and carry .whl/ with the working tree (`echo /.whl/ >> .git/info/exclude` keeps it out of git). They are
# installed into /tmp/gpu_check_site, not into the image's Python. tests/test_tour.py needs Jupyter's nbclient,
# which such images lack: it is left out where nbclient is not importable.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
DEADLINE=$((SECONDS + ${BUDGET:-100000}))
if [ "${1:-}" = "--wheels" ]; then  # antlr4-python3-runtime is a source archive on PyPI: built into a wheel here
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version "${WHEELS_PY:-3.12}" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform any -c constraints.txt -d .whl \
    hydra-core omegaconf filelock torch-fidelity &&
    "$PY" -m pip wheel --no-deps -c constraints.txt -w .whl antlr4-python3-runtime
  exit
fi
STEPS=" ${STEPS:-device cuda_tests fast_tier_on_cuda one_minute bench} "
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # the repository's gan/ and scripts/

step() {  # step NAME LIMIT COMMAND...: run it with at most LIMIT s (and what BUDGET has left); output in NAME.log
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  [[ $STEPS == *" ${name%%_[0-9]*} "* ]] || return 0  # not asked for (bench_64 is the step bench)
  local left=$((DEADLINE - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 10)); then
    echo "$name: not run, BUDGET spent" | tee -a "$OUT/summary.txt"
    return 1
  fi
  timeout -s INT -k 15 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - start)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
  return $status
}

if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu_check_site \
    "$WHEELS"/*.whl >>"$OUT/summary.txt" 2>&1 || echo "install: failed" >>"$OUT/summary.txt"
  export PYTHONPATH=$PYTHONPATH:/tmp/gpu_check_site
fi
skip=()
"$PY" -c "import nbclient" 2>/dev/null || skip=(--ignore=tests/test_tour.py)
step device 60 bash -c "nvidia-smi; nproc; $PY -c 'import torch, torchvision, hydra; print(torch.__version__, \
torch.version.cuda, torch.backends.cudnn.version(), torchvision.__version__, hydra.__version__, \
torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'"
step cuda_tests 150 "$PY" -m pytest -m cuda -q -p no:cacheprovider -o addopts="-ra --strict-markers" "${skip[@]}"
GAN_TEST_DEVICE=cuda step fast_tier_on_cuda 400 "$PY" -m pytest -m "not slow" -n 8 --dist loadfile \
  -q -p no:cacheprovider "${skip[@]}"
step one_minute 130 "$PY" scripts/one_minute.py trainer.device=cuda --out /tmp/one_minute_run
cp /tmp/one_minute_run/eval/metrics.json "$OUT/metrics.json" 2>/dev/null
bench=("$PY" scripts/bench.py --device cuda --rounds "${ROUNDS:-2}" --steps "${BENCH_STEPS:-500}" --precisions fp32 bf16 --compile --nchw
  --no-memory)
for size in ${SIZES:-64 32}; do
  step "bench_$size" 200 "${bench[@]}" --sizes "$size"
done
grep -h -E "passed|failed|error" "$OUT"/cuda_tests.log "$OUT"/fast_tier_on_cuda.log | tail -n 4 >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
