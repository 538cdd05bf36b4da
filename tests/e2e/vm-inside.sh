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

# The package's defaults, conffile untouched: discovery `auto` on a VM with no accelerator.
conffile_md5=$(dpkg-query -W -f='${Conffiles}' hcsd | awk '$1 == "/etc/hcsd/hcsd.toml" {print $2}')
say default_conffile=$([ "$(md5sum < /etc/hcsd/hcsd.toml | cut -d' ' -f1)" = "$conffile_md5" ] && echo pristine || echo changed)
systemctl enable --now hcsd
say default_active=$(systemctl is-active hcsd) default_substate=$(show SubState)
systemctl status hcsd --no-pager -l -n 0 | sed 's/^/DEFAULT_STATUS /'
hcsctl status > /run/default-status.txt 2>&1
sed 's/^/DEFAULT_HCSCTL /' /run/default-status.txt
say default_devices=$(awk '/^devices:/ {print $2}' /run/default-status.txt) default_not_found=$(grep -c ': not run, no ' /run/default-status.txt)
say default_status_ascend=$(sed -n 's/^ *\(not found: *\)\{0,1\}\(ascend: .*\)/\2/p' /run/default-status.txt | tr ' ' _)
say default_journal_notes=$(journalctl -u hcsd -b --no-pager -o cat | grep -c '^<*[0-9]*>*discovery: [a-z]*: not run, no ')
journalctl -u hcsd -b --no-pager -o cat | sed 's/^/DEFAULT_JOURNAL /'

# Device access: the Ascend and Cambricon nodes under their drivers' /proc/devices names
# (the test module registers each name; this kernel has neither driver), opened from inside
# the unit by an ExecStartPre= drop-in, and from outside it for contrast.
mkdir -p /run/systemd/system/hcsd.service.d
if insmod /usr/local/lib/hcs-e2e/hcs_e2e_chrdev.ko 2>/run/insmod.err; then
  major() { awk -v name="$1" '$2 == name {print $1}' /proc/devices; }
  grep -E 'devdrv-cdev|hisi_|devmm_svm|cambricon_|hcs_e2e' /proc/devices | sed 's/^/PROC_DEVICES /'
  nodes=""
  for pair in davinci0:devdrv-cdev davinci_manager:hisi_davinci_intf devmm_svm:devmm_svm \
      hisi_hdc:hisi_hdc cambricon_ctl:cambricon_ctl cambricon_dev0:cambricon_dev \
      hcs_e2e_denied:hcs_e2e_denied; do
    node=${pair%%:*}
    mknod /dev/$node c "$(major "${pair#*:}")" 0
    nodes="$nodes /dev/$node"
  done
  printf '[Service]\nExecStartPre=-/usr/bin/hcsd --open-device-nodes%s\n' "$nodes" > /run/systemd/system/hcsd.service.d/open.conf
  systemctl daemon-reload && systemctl restart hcsd
  journalctl -u hcsd -b --no-pager -o cat | grep '^open ' | sed 's/^/OPEN_UNIT /'
  for node in $nodes; do
    inside=$(journalctl -u hcsd -b --no-pager -o cat | grep "^open $node " | tail -1 | sed 's/.*): //')
    outside=$(hcsd --open-device-nodes $node | sed 's/.*): //')
    say open_${node#/dev/}=$(echo "$inside" | tr ' ' _) outside_${node#/dev/}=$(echo "$outside" | tr ' ' _)
  done
  say unit_device_allow=$(show DeviceAllow | tr ' \n' '_,')
  rm -f /run/systemd/system/hcsd.service.d/open.conf
  systemctl daemon-reload
else
  say chrdev_module=unavailable reason=$(tr ' ' _ < /run/insmod.err)
fi

# The rest needs devices: the simulated node (the package ships it as an example), NRI off.
cp /usr/local/lib/hcs-e2e/simulated.toml /etc/hcsd/hcsd.toml
systemctl restart hcsd
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

# Capabilities. The shipped set has no CAP_SYS_ADMIN; record what each set gives: without
# CAP_BPF, without CAP_PERFMON, CAP_SYS_ADMIN alone (what root has on kernels < 5.8), and the
# documented bcc drop-in (CAP_SYS_ADMIN and perf_event_open back) on top of the shipped unit.
say bounding_set=$(show CapabilityBoundingSet | tr ' ' ,) paranoid=$(cat /proc/sys/kernel/perf_event_paranoid)
caps_case() { # name, then the drop-in's [Service] lines
  name=$1; shift
  printf '[Service]\n' > /run/systemd/system/hcsd.service.d/cap.conf
  printf '%s\n' "$@" >> /run/systemd/system/hcsd.service.d/cap.conf
  systemctl daemon-reload && systemctl restart hcsd
  say caps_$name=$(show StatusText | sed 's/.*health from \([^,]*\),.*/\1/')
}
caps_case without_CAP_BPF 'CapabilityBoundingSet=~CAP_BPF'
caps_case without_CAP_PERFMON 'CapabilityBoundingSet=~CAP_PERFMON'
caps_case sys_admin_only 'CapabilityBoundingSet=' 'CapabilityBoundingSet=CAP_KILL CAP_SYS_ADMIN CAP_SYSLOG'
caps_case bcc_dropin 'CapabilityBoundingSet=CAP_SYS_ADMIN' 'SystemCallFilter=perf_event_open'
say bcc_dropin_caps=$(show CapabilityBoundingSet | tr ' ' ,) bcc_dropin_perf=$(show SystemCallFilter | grep -c perf_event_open)
rm -f /run/systemd/system/hcsd.service.d/cap.conf
systemctl daemon-reload && systemctl restart hcsd
# Why tracepoint attachment through perf_event_open (bcc; hcsd's programs before raw
# tracepoints) needs CAP_SYS_ADMIN here: Debian's kernel.perf_event_paranoid=3 check.
cat > /run/perf-tracepoint.py <<'X'
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
tp = int(open("/sys/kernel/tracing/events/printk/console/id").read())
attr = ctypes.create_string_buffer(struct.pack("<IIQ", 2, 128, tp).ljust(128, b"\0"), 128)
fd = libc.syscall(298, attr, -1, 0, -1, 8)  # PERF_TYPE_TRACEPOINT, every task, CPU 0
print("ok" if fd >= 0 else os.strerror(ctypes.get_errno()).replace(" ", "_"))
X
for cap in CAP_PERFMON CAP_SYS_ADMIN; do
  say perf_tracepoint_$cap=$(systemd-run --wait --quiet --pipe -p CapabilityBoundingSet=$cap python3 /run/perf-tracepoint.py 2>&1 | tail -1)
done
say kmsg_with_syslog=$(systemd-run --wait --quiet --pipe -p CapabilityBoundingSet=CAP_SYSLOG -p DeviceAllow='/dev/kmsg r' -p DevicePolicy=closed sh -c 'dd if=/dev/kmsg of=/dev/null bs=8192 count=1 2>/dev/null && echo ok || echo denied' 2>&1 | tail -1)
say kmsg_without_syslog=$(systemd-run --wait --quiet --pipe -p CapabilityBoundingSet= -p DeviceAllow='/dev/kmsg r' -p DevicePolicy=closed sh -c 'dd if=/dev/kmsg of=/dev/null bs=8192 count=1 2>/dev/null && echo ok || echo denied' 2>&1 | tail -1)

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

# A persistent start failure: a config error until the start limit stops the unit. The reason
# must stay reachable: systemctl status (STATUS=failed: ...), journalctl -p err, an OnFailure=
# hook (here one that saves the unit's status text). reset-failed first, so that the start
# limit counts only the starts of this check.
cat > /run/systemd/system/hcs-e2e-onfailure.service <<'X'
[Service]
ExecStart=/bin/sh -c 'systemctl show -p StatusText --value hcsd >> /run/hcsd-onfailure.txt'
Type=oneshot
X
printf '[Unit]\nOnFailure=hcs-e2e-onfailure.service\n' > /run/systemd/system/hcsd.service.d/onfailure.conf
systemctl daemon-reload
cp /etc/hcsd/hcsd.toml /run/hcsd.toml.good
printf '[daemon]\nbogus_key = 1\n' >> /etc/hcsd/hcsd.toml
systemctl reset-failed hcsd
systemctl restart hcsd 2>/dev/null
repeated() { journalctl -u hcsd -b --no-pager -o cat | grep -c 'Start request repeated too quickly'; }
for _ in $(seq 120); do [ "$(repeated)" -ge 1 ] && [ "$(systemctl is-failed hcsd)" = failed ] && break; sleep 1; done
sleep 2  # let the OnFailure= unit run
say start_limit_failed=$(systemctl is-failed hcsd) start_limit_result=$(show Result) start_limit_restarts=$(show NRestarts) start_limit_logged=$(repeated)
say start_limit_status=$(show StatusText | tr ' ' _)
systemctl status hcsd --no-pager -l -n 4 | sed 's/^/STATUS /'
say status_names_key=$(systemctl status hcsd --no-pager -l -n 4 | grep -c 'Status: "failed: /etc/hcsd/hcsd.toml: daemon.bogus_key: unknown key')
say journal_err_names_key=$(journalctl -u hcsd -b -p err --no-pager -o cat | grep -c '^hcsd: /etc/hcsd/hcsd.toml: daemon.bogus_key: unknown key')
say onfailure_runs=$(grep -c . /run/hcsd-onfailure.txt 2>/dev/null) onfailure_names_key=$(grep -c '^failed: /etc/hcsd/hcsd.toml: daemon.bogus_key' /run/hcsd-onfailure.txt 2>/dev/null)
say check_config=$(hcsd --check-config 2>&1 | grep -c '/etc/hcsd/hcsd.toml: daemon.bogus_key') check_config_rc=$(hcsd --check-config >/dev/null 2>&1; echo $?)
cp /run/hcsd.toml.good /etc/hcsd/hcsd.toml
say start_before_reset=$(systemctl start hcsd 2>/dev/null && echo started || echo refused) start_before_reset_result=$(show Result)
systemctl reset-failed hcsd && systemctl start hcsd
say after_reset=$(systemctl is-active hcsd) after_reset_status=$(show StatusText | cut -d, -f1 | tr ' ' _)
rm -f /run/systemd/system/hcsd.service.d/onfailure.conf /run/systemd/system/hcs-e2e-onfailure.service
systemctl daemon-reload
# The container runtime under systemd: containerd 2.3 (NRI v0.12, from the test peers' build;
# Debian 12's containerd 1.6 has no NRI). hcsctl setup restarts it through systemd's D-Bus
# API; hcsd follows its unit over D-Bus and re-registers as soon as it is active again.
if [ -x /usr/local/lib/hcs-e2e/containerd ]; then
  install -m 0755 /usr/local/lib/hcs-e2e/containerd /usr/local/bin/containerd
  install -m 0644 /usr/local/lib/hcs-e2e/containerd.service /etc/systemd/system/containerd.service
  mkdir -p /etc/containerd && printf 'version = 3\n' > /etc/containerd/config.toml
  systemctl daemon-reload && systemctl start containerd
  say containerd_active=$(systemctl is-active containerd) containerd_version=$(/usr/local/bin/containerd --version | awk '{print $3}')
  registered() { journalctl -u hcsd -b --no-pager -o cat | grep -c 'nri: registered as'; }
  wait_registered() { # until hcsd logged more than $1 registrations (30 s at most)
    for _ in $(seq 300); do [ "$(registered)" -gt "$1" ] && return 0; sleep 0.1; done
    return 1
  }
  hcsd_with() { # the simulated node with NRI on, plus $1 in [runtime]; wait for registration
    grep -v '^\[runtime\]$\|^nri = false$' /usr/local/lib/hcs-e2e/simulated.toml > /etc/hcsd/hcsd.toml
    printf '[runtime]\n%s\n' "$1" >> /etc/hcsd/hcsd.toml
    n=$(registered)
    systemctl restart hcsd
    wait_registered "$n"
  }
  reregister() { # systemctl restart containerd; "ms from its unit active to hcsd registered,ms from the restart"
    n=$(registered)
    began=$(cut -d' ' -f1 /proc/uptime)
    systemctl restart containerd
    if ! wait_registered "$n"; then echo none; return; fi
    active_us=$(systemctl show -p ActiveEnterTimestampMonotonic --value containerd)
    at=$(journalctl -u hcsd -b --no-pager -o short-monotonic | grep 'nri: registered as' | tail -1 | sed 's/^\[ *\([0-9.]*\)\].*/\1/')
    python3 -c "print(f'{($at * 1e6 - $active_us) / 1000:.0f},{($at - $began) * 1000:.0f}')"
  }
  # Before: the backoff alone (runtime_units empty: nothing followed).
  hcsd_with 'runtime_units = []' && say nri_registered_first=yes
  say backoff_reregister_ms=$(for _ in 1 2 3; do reregister; done | tr '\n' ' ' | sed 's/ $//; s/ /|/g')
  # After: hcsd follows containerd.service over D-Bus (the default).
  hcsd_with '' || say nri_registered_second=no
  say follow_logged=$(journalctl -u hcsd -b --no-pager -o cat _SYSTEMD_INVOCATION_ID="$(show InvocationID)" | grep -c 'following containerd.service, crio.service over D-Bus')
  say follow_reregister_ms=$(for _ in 1 2 3; do reregister; done | tr '\n' ' ' | sed 's/ $//; s/ /|/g')
  say follow_starting_logged=$(journalctl -u hcsd -b --no-pager -o cat | grep -c 'nri: containerd.service is starting; connecting as soon as it listens')
  # hcsctl setup containerd --yes: writes the drop-in, restarts containerd over D-Bus, waits.
  pid_before=$(systemctl show -p MainPID --value containerd)
  n=$(registered)
  hcsctl setup containerd --yes > /run/setup.txt 2>&1
  say setup_rc=$?
  sed 's/^/SETUP /' /run/setup.txt
  say setup_active_again=$(grep -c '^containerd.service is active again (' /run/setup.txt) setup_seconds=$(sed -n 's/^containerd.service is active again (\([0-9.]*\) s)$/\1/p' /run/setup.txt)
  say setup_new_pid=$([ "$(systemctl show -p MainPID --value containerd)" != "$pid_before" ] && echo yes || echo no) setup_containerd=$(systemctl is-active containerd) setup_dropin=$([ -f /etc/containerd/conf.d/10-hcsd-nri.toml ] && echo yes || echo no)
  say setup_reregistered=$(wait_registered "$n" && echo yes || echo no)
  # A running unit whose next start fails: the restart's failure as real systemd reports it
  # (a stopped unit would get TryRestartUnit and be left stopped).
  printf '%s\n' '[Service]' 'Type=oneshot' 'RemainAfterExit=yes' \
    'ExecStart=/bin/sh -c "test ! -e /run/hcs-e2e-fail"' > /run/systemd/system/hcs-e2e-fails.service
  rm -f /run/hcs-e2e-fail
  systemctl daemon-reload && systemctl start hcs-e2e-fails.service && touch /run/hcs-e2e-fail
  mkdir -p /run/e2e-root/etc/containerd && printf 'version = 3\n' > /run/e2e-root/etc/containerd/config.toml
  hcsctl setup containerd --yes --root /run/e2e-root --restart --unit hcs-e2e-fails.service > /run/setup-fails.txt 2>&1
  say fails_rc=$?
  sed 's/^/SETUP_FAILS /' /run/setup-fails.txt
  say fails_message=$(grep -m1 '^hcsctl: ' /run/setup-fails.txt | tr ' ' _)
  rm -f /run/systemd/system/hcs-e2e-fails.service /run/hcs-e2e-fail && systemctl daemon-reload
  journalctl -u hcsd -u containerd -b --no-pager -o short-monotonic | grep 'nri: \|containerd.service\|D-Bus' | sed 's/^/RUNTIME_JOURNAL /'
  say runtime_tracebacks=$(journalctl -u hcsd -b --no-pager | grep -c Traceback)
  cp /run/hcsd.toml.good /etc/hcsd/hcsd.toml
else
  say containerd=unavailable
fi
systemctl stop hcsd
say done
