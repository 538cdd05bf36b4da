#!/usr/bin/env bash
# Runs every libhcs test program in the configurations it is meant for, plus sanitizer and
# valgrind runs, and ends with one line `N passed, N failed` (a check counts once per run).
set -u
cd "$(dirname "$0")"
root=$(cd .. && pwd)
build=$root/build/tests
lib=$root/build/libhcs.so
fakes=$build/fakes
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 skipped=0

record() { # name rc output
  local name=$1 rc=$2 output=$3 p f
  read -r p f < <(awk '/^RESULT /{p+=$3; f+=$4} END{print p+0, f+0}' <<<"$output")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$f" -ne 0 ]; then
    echo "FAIL $name (rc $rc)"; grep -v '^RESULT' <<<"$output" | tail -20
  else
    echo "ok   $name: $p checks"
  fi
}

run() { # name env... -- command...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local output rc
  output=$(env LD_LIBRARY_PATH="$fakes:$build" "${envs[@]}" "$@" 2>&1); rc=$?
  record "$name" "$rc" "$output"
}

quota_dir() { # ordinal-uuid limit
  local dir; dir=$(mktemp -d -p "$work")
  printf 'version=1\ncontainer=test\ndevices=1\ndevice.0.uuid=%s\ndevice.0.vendor=nvidia\ndevice.0.vram_limit=%s\ndevice.0.compute_percent=100\n' "$1" "$2" > "$dir/quota.conf"
  echo "$dir"
}

# The library exports exactly dlsym and the rows of src/symbols.h (through the generated map).
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^GLIBC\|^LIBHCS' | sort)
table=$(tr ' ;' '\n\n' < "$root/build/libhcs.map" | grep -E '^(dlsym|cu|nvml|hip|acl|rt|cn)' | sort)
if [ -n "$table" ] && [ "$exported" = "$table" ]; then
  record exports 0 "RESULT e 1 0"
else
  record exports 1 "$(diff <(echo "$exported") <(echo "$table"))"
fi

Q1G="HCS_VRAM_QUOTA=1Gi"
run cuda-direct $Q1G LD_PRELOAD=$lib -- "$build/t_cuda"
run vmm-locations $Q1G LD_PRELOAD=$lib -- "$build/t_vmm"
run lookup $Q1G LD_PRELOAD=$lib -- "$build/t_lookup"
run vendors $Q1G LD_PRELOAD=$lib -- "$build/t_vendors"
run constructor $Q1G LD_PRELOAD=$lib -- "$build/t_ctor"
dir=$(quota_dir GPU-fake-3 $((2 << 30)))
run nvml HCS_CONFIG=$dir/quota.conf LD_PRELOAD=$lib -- "$build/t_nvml"
dir=$(quota_dir GPU-fake-0 $((1 << 30)))
run multi-process HCS_CONFIG=$dir/quota.conf LD_PRELOAD=$lib -- "$build/t_multiproc"
test -f "$dir/usage.shm" && record usage-region-file 0 "RESULT r 1 0" || record usage-region-file 1 "RESULT r 0 1"
run stress HCS_VRAM_QUOTA=64Mi LD_PRELOAD=$lib -- "$build/t_stress"
run fork-private $Q1G LD_PRELOAD=$lib -- "$build/t_fork"
dir=$(quota_dir GPU-fake-0 $((1 << 30)))
run fork-shared HCS_CONFIG=$dir/quota.conf LD_PRELOAD=$lib -- "$build/t_fork"
share_dir() { # percent
  local dir; dir=$(quota_dir GPU-fake-0 $((1 << 30)))
  sed -i "s/compute_percent=100/compute_percent=$1/" "$dir/quota.conf"; echo "$dir"
}
dir=$(share_dir 25)
run compute-share-25 HCS_CONFIG=$dir/quota.conf EXPECT_SHARE=25 LD_PRELOAD=$lib -- "$build/t_compute"
dir=$(share_dir 100)
run compute-unlimited HCS_CONFIG=$dir/quota.conf EXPECT_SHARE=100 LD_PRELOAD=$lib -- "$build/t_compute"

# Malformed settings: enforcement off, exactly one clear line, the application unharmed.
bad=$(mktemp -p "$work"); printf 'version=7\n' > "$bad"
for case in "HCS_CONFIG=$bad" "HCS_VRAM_QUOTA=lots" "HCS_CONFIG=$work/absent.conf"; do
  output=$(env LD_LIBRARY_PATH="$fakes" "$case" LD_PRELOAD=$lib "$build/t_passthrough" 2>&1); rc=$?
  lines=$(grep -c '^libhcs: ' <<<"$output")
  if [ "$lines" -eq 1 ]; then record "malformed $case" $rc "$output"; else
    record "malformed $case" 1 "$output"; fi
done
run no-config LD_PRELOAD=$lib -- "$build/t_passthrough"
# A real binary and a shell under the preload: nothing printed, nothing broken.
output=$(env LD_PRELOAD=$lib $Q1G /bin/sh -c 'echo smoke; /bin/true' 2>&1); rc=$?
[ "$output" = "smoke" ] && record smoke-real-binaries $rc "RESULT s 1 0" || record smoke-real-binaries 1 "$output"

# AddressSanitizer + UndefinedBehaviorSanitizer builds.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run asan-cuda $Q1G -- "$build/asan/t_cuda"
run asan-vmm-locations $Q1G -- "$build/asan/t_vmm"
run asan-lookup $Q1G -- "$build/asan/t_lookup"
run asan-vendors $Q1G -- "$build/asan/t_vendors"
dir=$(quota_dir GPU-fake-0 $((1 << 30)))
run asan-multi-process HCS_CONFIG=$dir/quota.conf -- "$build/asan/t_multiproc"
run asan-stress HCS_VRAM_QUOTA=64Mi STRESS_ITERATIONS=200000 -- "$build/asan/t_stress"
run asan-fork $Q1G FORK_CHILDREN=100 -- "$build/asan/t_fork"

# valgrind (memcheck) with the normal build preloaded; fewer stress iterations (it is ~50x slower).
if command -v valgrind >/dev/null; then
  vg=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite)
  run valgrind-cuda $Q1G LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_cuda"
  run valgrind-vmm-locations $Q1G LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_vmm"
  run valgrind-lookup $Q1G LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_lookup"
  run valgrind-vendors $Q1G LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_vendors"
  run valgrind-stress HCS_VRAM_QUOTA=16Mi STRESS_ITERATIONS=5000 LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_stress"
  dir=$(quota_dir GPU-fake-0 $((1 << 30)))
  run valgrind-multi-process HCS_CONFIG=$dir/quota.conf LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_multiproc"
  run valgrind-fork $Q1G FORK_CHILDREN=30 LD_PRELOAD=$lib -- "${vg[@]}" "$build/t_fork"
else
  echo "SKIPPED valgrind runs: valgrind is not installed (apt install valgrind)"; skipped=$((skipped + 7))
fi

if [ "$skipped" -gt 0 ]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
