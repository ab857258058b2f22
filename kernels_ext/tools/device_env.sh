# Sourced (not run) by the device scripts, from the repository root, after they set OUT: makes $OUT,
# sets $LOG and step(), puts the carried wheels (.whl/: pydantic for the image's Python 3.12) and
# harness/ and route_env/ (qgate_kernels imports qgate_route_env) on PYTHONPATH.
mkdir -p "$OUT"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1
step() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/harness:$PWD/route_env${PYTHONPATH:+:$PYTHONPATH}
