"""The packages: build, lint, install into a Debian 12 root and an rpm --root tree.

Slow: the first run builds the Debian root with debootstrap (cached in ~/.cache/hcs).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_CONFIG, in_root, need, sh

pytestmark = pytest.mark.slow


def test_packages_lint_clean(packages: dict[str, Path]) -> None:
    for name in ("deb1", "rpm1"):
        assert packages[name].stat().st_size > 0
        print(f"{packages[name].name}: {packages[name].stat().st_size} bytes")
    if shutil.which("lintian"):
        out = sh("lintian", packages["deb1"], check=False)
        assert not [line for line in out.splitlines() if line.startswith("E:")], out
    else:
        print("SKIP lintian: not installed")
    if shutil.which("rpmlint"):
        out = sh("rpmlint", "-c", "packaging/rpm/rpmlint.toml", packages["rpm1"], check=False,
                 cwd=Path(__file__).resolve().parents[2])  # fmt: skip
        assert " 0 errors" in out, out
    else:
        print("SKIP rpmlint: not installed")


def test_deb_install_run_upgrade_purge(packages: dict[str, Path], debian_root: Path) -> None:
    root = debian_root
    shutil.copy(packages["deb1"], root / "tmp-hcsd1.deb")
    shutil.copy(packages["deb2"], root / "tmp-hcsd2.deb")
    run_hcsd = (
        "hcsd --config /etc/hcsd/hcsd.toml & pid=$!; "
        "for i in $(seq 50); do [ -S /run/hcsd/api/hcsd.sock ] && break; sleep 0.2; done; "
    )
    out = in_root(
        root,
        "dpkg -i /tmp-hcsd1.deb; hcsd --version; hcsctl --help | head -3; "
        "test -L /opt/hcsd/venv; test -f /usr/lib/hcs/bpf/kmsg.bpf.o; "
        "test -f /usr/share/containers/oci/hooks.d/hcs.json; "
        "test -L /etc/systemd/system/multi-user.target.wants/hcsd.service; "
        "hcs-syncer --version; hcs-scheduler-extender --version; "
        "test -f /lib/systemd/system/hcs-syncer.service; "
        "test ! -e /etc/systemd/system/multi-user.target.wants/hcs-syncer.service; "
        "test -f /usr/share/hcsd/kubernetes/crds/computenodes.yaml; "
        "test -f /usr/share/man/man8/hcs-syncer.8.gz; "
        # the kubectl plugin: kubectl runs /usr/bin/kubectl-hcs as `kubectl hcs`
        "kubectl-hcs --help | head -n 1; test -f /usr/share/man/man1/kubectl-hcs.1.gz; "
        "test -f /usr/share/hcsd/kubernetes/rbac-viewer.yaml; "
        "diff /etc/hcsd/hcsd.toml /dev/null | grep -q 'print-default\\|Every key' || "
        "  grep -q '^#backends' /etc/hcsd/hcsd.toml; "
        # the packaged default: real backends, whatever the node has
        "grep -q '^#backends = \\[\"auto\"\\]' /etc/hcsd/hcsd.toml; "
        f"cat > /etc/hcsd/hcsd.toml <<'X'\n{TEST_CONFIG}X\n"
        f"{run_hcsd} hcsctl devices; hcsctl allocate --container e2e-1 --vram 1Gi; "
        "kill $pid; wait $pid; ls /var/lib/hcsd; md5sum /var/lib/hcsd/journal",
    )
    print(out)
    assert "hcsd 0.1.0" in out and "allocated" in out
    assert "hcs-syncer 0.1.0" in out and "hcs-scheduler-extender 0.1.0" in out
    assert "usage: kubectl hcs" in out
    journal_sum = next(line for line in out.splitlines() if "/var/lib/hcsd/journal" in line)
    out = in_root(
        root,
        "dpkg -i --force-confold /tmp-hcsd2.deb; dpkg -s hcsd | grep Version; "
        "md5sum /var/lib/hcsd/journal; echo VENVS $(ls -d /opt/hcsd/venv-*); "
        f"{run_hcsd} hcsctl allocations; kill $pid; wait $pid",
    )
    print(out)
    assert "Version: 0.1.0-2" in out
    assert journal_sum in out, "the upgrade changed the ledger"
    assert "e2e-1" in out, "the allocation did not survive the upgrade"
    assert "VENVS /opt/hcsd/venv-0.1.0-2\n" in out, "the old venv was not pruned"
    out = in_root(
        root,
        "dpkg -r hcsd; test -d /var/lib/hcsd && echo LEDGER-KEPT; test ! -e /opt/hcsd && "
        "echo VENV-GONE; dpkg -P hcsd; test ! -e /var/lib/hcsd && test ! -e /etc/hcsd && "
        "test ! -e /usr/bin/hcsd && echo PURGED; dpkg -S /usr/lib/hcs 2>&1 || true",
    )
    print(out)
    assert "LEDGER-KEPT" in out and "VENV-GONE" in out and "PURGED" in out
    leftovers = [
        p for p in ("opt/hcsd", "usr/lib/hcs", "var/lib/hcsd", "etc/hcsd") if (root / p).exists()
    ]
    assert not leftovers, leftovers


def test_rpm_into_root_tree(packages: dict[str, Path], debian_root: Path) -> None:
    """rpm --root into the Debian root: it has /bin/sh and python3, so the scriptlets run for real.
    --nodeps because the tree's packages are dpkg's, not rpm's."""
    need("rpm")
    rpm = packages["rpm1"]
    files = sh("rpm", "-qlp", rpm)
    for path in (
        "/usr/bin/hcsd", "/usr/lib/hcs/install-venv", "/usr/lib/hcs/bpf/ras.bpf.o",
        "/usr/lib/systemd/system/hcsd.service", "/usr/lib/tmpfiles.d/hcsd.conf",
        "/usr/lib/systemd/system/hcs-syncer.service", "/usr/bin/hcs-syncer",
        "/usr/bin/kubectl-hcs", "/usr/share/hcsd/kubernetes/scheduler.yaml",
        "/etc/hcsd/hcsd.toml", "/usr/share/containers/oci/hooks.d/hcs.json", "/var/lib/hcsd",
    ):  # fmt: skip
        assert path in files.splitlines(), path
    if Path("libhcs/build/libhcs.so").exists():
        assert "/usr/lib/hcs/libhcs.so" in files
    assert "/etc/hcsd/hcsd.toml" in sh("rpm", "-qcp", rpm)
    scripts = sh("rpm", "-qp", "--scripts", rpm)
    for part in ("postinstall", "preuninstall", "postuninstall", "posttrans", "preset"):
        assert part in scripts, part
    root = debian_root
    shutil.copy(rpm, root / "hcsd.rpm")
    sh("rpm", "--root", root, "--initdb")
    # rpm runs the scriptlets chrooted in --root: give it /proc and /dev the same way.
    out = sh(
        "unshare", "--mount", "--propagation", "private", "--fork", "sh", "-ec",
        f"mount -t proc proc {root}/proc; mount --rbind /dev {root}/dev; "
        f"mount -t tmpfs tmpfs {root}/run; "
        f"rpm --root {root} --nodeps -ivh {root}/hcsd.rpm; "
        f"chroot {root} hcsd --version; chroot {root} systemctl is-enabled hcsd.service; "
        f"echo ledger > {root}/var/lib/hcsd/journal; rpm --root {root} -e hcsd; "
        f"test -f {root}/var/lib/hcsd/journal && echo LEDGER-KEPT; "
        f"test ! -e {root}/opt/hcsd && echo VENV-GONE",
    )  # fmt: skip
    print(out)
    assert "hcsd 0.1.0" in out
    assert "enabled" in out
    assert "LEDGER-KEPT" in out and "VENV-GONE" in out
