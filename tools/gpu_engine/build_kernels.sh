#!/usr/bin/env bash
# build_kernels.sh: kernels_ext for the device's GPU (sm_90 on the H200) into the image's python3, then
# its build_info. Started by calls/stage.sh 01 in the background; writes $GE/build.rc ("rc=N seconds=S")
# when done. It builds a copy ($GE/kx), not the checkout: the next calls lay the checkout anew while
# this runs. The install registers the vLLM plugin's entry point; lib.sh's use_engine copies the built
# _C*.so next to the checkout's qgate_kernels, which PYTHONPATH puts first, so the plugin's Python is
# always the checkout's (a fix made between calls takes effect without a rebuild).
GE=${GE:-/tmp/ge}
t0=$(date +%s)
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} QGATE_KERNELS_CUDA=1
rm -rf "$GE/kx" "$GE/kh" "$GE/kr" && cp -r kernels_ext "$GE/kx" && cp -r harness "$GE/kh" && cp -r route_env "$GE/kr" \
  && rm -rf "$GE/kx/build" "$GE/kx"/qgate_kernels/_C*.so || { echo "rc=8 seconds=0" > "$GE/build.rc"; exit 8; }
export PYTHONPATH=$GE/kh:$GE/kr${PYTHONPATH:+:$PYTHONPATH}
(cd "$GE/kx" && python3 -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir .)
rc=$?
so=$(cd / && python3 -c "import qgate_kernels, glob, os; print(glob.glob(os.path.dirname(qgate_kernels.__file__) + '/_C*.so')[0])")
[ $rc = 0 ] && [ -f "$so" ] && echo "$so" > "$GE/so.path" || rc=9
(cd / && python3 -c "import qgate_kernels as q; print(q.build_info(), q.cuda_kernels_available())")
echo "rc=$rc seconds=$(( $(date +%s) - t0 ))" > "$GE/build.rc"
