#!/usr/bin/env bash
# The GPU check, prepared on a CPU machine and run once on a lent GPU machine. It writes everything
# under $OUT (default /tmp/gpu_check): the device, the CUDA tests, the fast tier on CUDA (stopping at
# the first failure), the speed table at 32 and 64 px, and one minute of the default run, measured.
#
#   bash scripts/gpu_check.sh                 # with the repository's requirements already importable
#   WHEELS=.whl bash scripts/gpu_check.sh     # first install, offline, the wheels carried in .whl/
#
# A machine with no network but its own torch needs only what its image lacks (hydra-core, omegaconf,
# antlr4-python3-runtime 4.9.3, torch-fidelity): download them for its Python on a machine that has pip,
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform any -d .whl hydra-core omegaconf torch-fidelity
#   python3 -m pip download --no-deps -d .whl antlr4-python3-runtime==4.9.3   # a source archive only
# and carry .whl/ with the working tree (`echo /.whl/ >> .git/info/exclude` keeps it out of git). Each step's exit status goes to $OUT/summary.txt; a failed
# step does not stop the later ones, except that the fast tier stops at its first failure (-x).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # the repository's gan/ and scripts/, installed or not

step() {  # step NAME COMMAND...: run it, its output in $OUT/NAME.log, its exit status in summary.txt
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  return $status
}

if [ -n "${WHEELS:-}" ]; then
  step install "$PY" -m pip install --no-index --no-deps --no-build-isolation --find-links "$WHEELS" "$WHEELS"/*
fi
step device bash -c "nvidia-smi; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, \
torch.backends.cudnn.version(), torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'"
step cuda_tests "$PY" -m pytest -m cuda -q -p no:cacheprovider -o addopts="-ra"
GAN_TEST_DEVICE=cuda step fast_tier_on_cuda "$PY" -m pytest -m "not slow" -x -q -p no:cacheprovider
step bench "$PY" scripts/bench.py --device cuda --sizes 32 64 --rounds 3 --steps 100 --precisions fp32 bf16 \
  --compile --no-memory
step one_minute "$PY" scripts/one_minute.py trainer.device=cuda --out "$OUT/one_minute_run"
grep -h -E "passed|failed|error" "$OUT"/cuda_tests.log "$OUT"/fast_tier_on_cuda.log | tail -n 4 >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
