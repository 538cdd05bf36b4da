#!/usr/bin/env bash
# libhcs on a real GPU (make -C libhcs gpu-test): the C checks of t_real_cuda.c, then PyTorch
# through cudart if it is importable (PYTHON, default python3). Ends with `N passed, N failed`.
set -u
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
lib=$root/build/libhcs.so
bin=$root/build/tests/gpu/t_real_cuda
python=${PYTHON:-python3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
passed=0 failed=0
count() { # output
  local p f; read -r p f < <(awk '/^RESULT /{p+=$3; f+=$4} END{print p+0, f+0}' <<<"$1")
  passed=$((passed + p)); failed=$((failed + f))
}
out=$(env -u HCS_CONFIG HCS_VRAM_QUOTA=1Gi LD_PRELOAD=$lib "$bin" 2>&1); echo "$out"; count "$out"
for share in 25 100; do
  printf 'version=1\ncontainer=gpu\ndevices=1\ndevice.0.uuid=GPU-0\ndevice.0.vendor=nvidia\ndevice.0.vram_limit=%s\ndevice.0.compute_percent=%s\n' \
    $((8 << 30)) $share > "$work/quota.conf"
  out=$(HCS_CONFIG=$work/quota.conf COMPUTE_SHARE=$share LD_PRELOAD=$lib "$bin" 2>&1)
  echo "$out"; count "$out"
done
if "$python" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  for conf in "" "expandable_segments:True"; do
    out=$(env -u HCS_CONFIG HCS_VRAM_QUOTA=1Gi PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$lib \
      "$python" torch_quota.py 2>&1); echo "$out"; count "$out"
  done
else
  echo "SKIPPED PyTorch: $python has no CUDA-enabled torch"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
