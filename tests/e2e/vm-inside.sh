#!/bin/sh
# Runs inside the VM as a oneshot unit after boot; every result is a line "E2E key=value" on
# the serial console, then the VM powers off. Driven by test_vm.py.
set -u
say() { echo "E2E $*"; }
show() { systemctl show -p "$1" --value hcsd; }
wait_active_pid_not() { # wait until hcsd is active with a main pid other than $1
  for _ in $(seq 150); do
    pid=$(show MainPID)
    [ "$(systemctl is-active hcsd)" = active ] && [ "$pid" != 0 ] && [ "$pid" != "$1" ] && return 0
    sleep 0.2
  done
  return 1
}
say begin kernel=$(uname -r) systemd=$(systemctl --version | head -1 | cut -d' ' -f2)
say verify=$(systemd-analyze verify hcsd.service hcs-syncer.service 2>&1 | tr '\n' '|' | tr ' ' '_')
say security=$(systemd-analyze security hcsd 2>/dev/null | sed -n 's/.*Overall exposure level for hcsd.service: //p')

systemctl enable --now hcsd
say active=$(systemctl is-active hcsd) substate=$(show SubState)
start=$(show ExecMainStartTimestampMonotonic)
ready=$(show ActiveEnterTimestampMonotonic)
say start_to_ready_ms=$(( (ready - start) / 1000 ))
say status=$(show StatusText | tr ' ' '_')
sleep 10
pid=$(show MainPID)
say idle_rss_kib=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
say nofile=$(awk '/Max open files/ {print $4}' /proc/$pid/limits) tasks_max=$(show TasksMax) memory_max=$(show MemoryMax) kernel_tunables=$(show ProtectKernelTunables)
say health_source=$(show StatusText | sed 's/.*health from \([^,]*\),.*/\1/')

# 2,000 connections held on the metrics port by an unprivileged user: hcsd keeps few of them.
fds_before=$(ls /proc/$pid/fd | wc -l)
runuser -u nobody -- python3 -c '
import resource, socket, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(2000):
    s = socket.socket(); s.setblocking(False); s.connect_ex(("127.0.0.1", 9400)); held.append(s)
time.sleep(3)
' &
flood=$!
sleep 2
say flood_fds=$(( $(ls /proc/$pid/fd | wc -l) - fds_before )) flood_api=$(hcsctl status >/dev/null 2>&1 && echo yes || echo no)
wait $flood
sleep 6
say flood_metrics_after=$(python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=10).status)' 2>&1 | tail -1) flood_active=$(systemctl is-active hcsd) flood_same_pid=$([ "$(show MainPID)" = "$pid" ] && echo yes || echo no)
say flood_log_lines=$(journalctl -u hcsd --no-pager -o cat _PID=$pid | grep -c 'metrics:\|out of system resource')

hcsctl allocate --container e2e-vm --vram 1Gi >/dev/null && say allocated=yes
before=$(hcsctl --json allocations | md5sum | cut -d' ' -f1)
kill -9 "$pid"
if wait_active_pid_not "$pid"; then
  after=$(hcsctl --json allocations | md5sum | cut -d' ' -f1)
  say kill9_restarted=yes restarts=$(show NRestarts) ledger_intact=$([ "$before" = "$after" ] && echo yes || echo no)
else
  say kill9_restarted=no
fi

# Capabilities: drop each one in turn and see what hcsd's health source becomes.
mkdir -p /run/systemd/system/hcsd.service.d
for cap in CAP_BPF CAP_PERFMON CAP_SYS_ADMIN; do
  printf '[Service]\nCapabilityBoundingSet=~%s\n' "$cap" > /run/systemd/system/hcsd.service.d/cap.conf
  systemctl daemon-reload && systemctl restart hcsd
  say without_$cap=$(show StatusText | sed 's/.*health from \([^,]*\),.*/\1/')
done
rm -f /run/systemd/system/hcsd.service.d/cap.conf
say kmsg_with_syslog=$(systemd-run --wait --quiet --pipe -p CapabilityBoundingSet=CAP_SYSLOG -p DeviceAllow='/dev/kmsg r' -p DevicePolicy=closed sh -c 'head -c1 /dev/kmsg >/dev/null && echo ok || echo denied' 2>&1 | tail -1)
say kmsg_without_syslog=$(systemd-run --wait --quiet --pipe -p CapabilityBoundingSet= -p DeviceAllow='/dev/kmsg r' -p DevicePolicy=closed sh -c 'head -c1 /dev/kmsg >/dev/null && echo ok || echo denied' 2>&1 | tail -1)

# Watchdog: a short WatchdogSec for the test, then freeze the main loop.
printf '[Service]\nTimeoutAbortSec=2s\nWatchdogSec=3s\n' > /run/systemd/system/hcsd.service.d/watchdog.conf
systemctl daemon-reload && systemctl restart hcsd
pid=$(show MainPID)
kill -STOP "$pid"
if wait_active_pid_not "$pid"; then
  say watchdog_restarted=yes
else
  say watchdog_restarted=no
fi
say watchdog_logged=$(journalctl -u hcsd --no-pager | grep -c 'Watchdog timeout')
rm -f /run/systemd/system/hcsd.service.d/watchdog.conf
systemctl daemon-reload && systemctl restart hcsd
say final_active=$(systemctl is-active hcsd) allocations=$(hcsctl --json allocations | grep -c e2e-vm)
journalctl -u hcsd --no-pager -o cat | sed 's/^/JOURNAL /'
say journal_tracebacks=$(journalctl -u hcsd --no-pager | grep -c Traceback)
say journal_warnings=$(journalctl -u hcsd --no-pager -o cat -p warning | grep -vc 'Watchdog\|SIGKILL\|SIGABRT\|Main process exited\|Failed with result\|dumped core\|Killing process')
systemctl stop hcsd
say done
