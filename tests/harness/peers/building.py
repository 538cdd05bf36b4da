"""The real runtime peers of the integration tests, built from their Go modules and cached.

No container runtime with NRI ships in Debian 12 (its containerd 1.6 predates NRI), and no
registry is reachable, so containerd, its runc shim, ctr and crictl are built from the Go module
proxy once and cached under `~/.cache/hcs/peers/<name>-<version>/`; a warm run only looks at the
files. runc is Debian's (`apt install runc`). Builds are serialised with a file lock so that two
pytest workers never build the same thing twice, and they say what they do: a cold build takes
minutes. When a peer cannot be had the caller gets the reason as a string, so that tests skip
loudly instead of passing silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The newest 2.3 patch on the module proxy when this was written (`go list -m -versions
# github.com/containerd/containerd/v2`); it vendors NRI v0.12.
CONTAINERD_VERSION = os.environ.get("HCS_CONTAINERD_VERSION", "v2.3.7")
# The newest 1.7 patch: NRI v0.8, off by default. Optional: hcsd must keep working with it.
CONTAINERD_17_VERSION = os.environ.get("HCS_CONTAINERD_17_VERSION", "v1.7.35")
# The proxy refuses to list cri-tools' versions (403) but serves a named one.
CRICTL_VERSION = os.environ.get("HCS_CRICTL_VERSION", "v1.36.0")
RUNC = Path("/usr/sbin/runc")

CACHE = Path(os.environ.get("HCS_CACHE", str(Path.home() / ".cache" / "hcs")))
PEERS = CACHE / "peers"
GO_CACHE = CACHE / "go"
GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
BUILD_TIMEOUT = 1800.0
CONTAINERD_TAGS = "no_btrfs urfave_cli_no_docs"

Log = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """One binary to build: a package of the module and how."""

    package: str  # relative to the module root, e.g. "cmd/containerd"
    tags: str = ""
    cgo: bool | None = None  # None: Go's default
    ldflags: str = ""


@dataclass(frozen=True)
class Binaries:
    """Paths of the peers a `Containerd` needs; `containerd_version` names the build."""

    containerd: Path
    shim: Path
    ctr: Path
    runc: Path
    crictl: Path
    containerd_version: str
    crictl_version: str

    @property
    def containerd_major(self) -> int:
        """1 or 2: the config format and plugin names differ between the two lines."""
        return int(self.containerd_version.lstrip("v").split(".")[0])


def _print(message: str) -> None:
    print(message, flush=True)


def find_go() -> str | None:
    """The Go toolchain: PATH first, then where the official tarball and Debian put it."""
    found = shutil.which("go")
    if found is not None:
        return found
    for candidate in GO_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def _go_env(gobin: Path | None, cgo: bool | None) -> dict[str, str]:
    """Caches under ~/.cache/hcs/go so warm builds are fast; never fetch another toolchain."""
    env = dict(os.environ)
    env.update(
        GOPATH=str(GO_CACHE),
        GOMODCACHE=str(GO_CACHE / "pkg" / "mod"),
        GOCACHE=str(GO_CACHE / "cache"),
        GOTOOLCHAIN="local",
    )
    if gobin is not None:
        env["GOBIN"] = str(gobin)
    if cgo is not None:
        env["CGO_ENABLED"] = "1" if cgo else "0"
    return env


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One builder at a time across processes (pytest workers, the benchmarks)."""
    PEERS.mkdir(parents=True, exist_ok=True)
    with open(PEERS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _complete(directory: Path, names: list[str]) -> bool:
    return (directory / "BUILT").exists() and all(
        os.access(directory / name, os.X_OK) for name in names
    )


def _run_go(args: list[str], env: dict[str, str], cwd: Path | None, log_file: Path) -> str | None:
    """Run one `go` command at low priority (the machine is shared); None or the failure."""
    with open(log_file, "a") as out:
        out.write(f"\n$ {' '.join(args)}\n")
        out.flush()
        try:
            result = subprocess.run(
                ["nice", "-n", "10", *args],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"`{' '.join(args[1:3])}` ran past {BUILD_TIMEOUT:.0f} s"
    if result.returncode == 0:
        return None
    lines = log_file.read_text(errors="replace").splitlines()
    return f"`go {args[1]}` exited {result.returncode}:\n" + "\n".join(lines[-15:])


def _build(
    name: str,
    module: str,
    version: str,
    targets: list[Target],
    log: Log,
    *,
    as_main_module: bool = False,
    remember_failure: bool = False,
) -> Path | str:
    """Build `targets` of `module@version` into PEERS/<name>-<version>; the directory or why not.

    `as_main_module` builds from a copy of the module's source instead of `go install
    pkg@version`, which Go refuses for modules whose go.mod has `exclude` or `replace`
    directives (containerd 1.7). `remember_failure` keeps the reason in a file so that an
    optional peer that cannot be built does not cost minutes on every run (delete the
    `.failed` file to try again).
    """
    final = PEERS / f"{name}-{version}"
    names = [Path(t.package).name for t in targets]
    failed = PEERS / f"{name}-{version}.failed"
    if _complete(final, names):
        return final
    with build_lock():
        if _complete(final, names):  # another process built it while we waited
            return final
        if failed.exists():
            return failed.read_text().strip()
        go = find_go()
        if go is None:
            return f"Go is not installed (looked in PATH and {', '.join(GO_CANDIDATES)})"
        staging = PEERS / f".{name}-{version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        build_log = PEERS / f"{name}-{version}.log"
        build_log.write_text("")
        started = time.monotonic()
        reason = _build_into(go, module, version, targets, staging, build_log, log, as_main_module)
        if reason is not None:
            shutil.rmtree(staging, ignore_errors=True)
            reason = f"building {name} {version} failed: {reason}"
            log(f"peers: {reason}")
            if remember_failure:
                failed.write_text(reason + "\n")
            return reason
        go_version = subprocess.run(
            [go, "version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        (staging / "BUILT").write_text(
            json.dumps(
                {
                    "module": module,
                    "version": version,
                    "go": go_version,
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
            + "\n"
        )
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        log(f"peers: {name} {version} built in {time.monotonic() - started:.0f} s -> {final}")
        return final


def _build_into(
    go: str,
    module: str,
    version: str,
    targets: list[Target],
    out: Path,
    build_log: Path,
    log: Log,
    as_main_module: bool,
) -> str | None:
    source: Path | None = None
    if as_main_module:
        log(f"peers: downloading {module}@{version} to build it as the main module")
        found = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            env=_go_env(None, None),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if found.returncode != 0:
            return f"`go mod download` failed: {(found.stdout + found.stderr).strip()[-800:]}"
        source = out.parent / f".{out.name}-src"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(json.loads(found.stdout)["Dir"], source)
        for path in [source, *source.rglob("*")]:  # the module cache is read-only
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    try:
        for target in targets:
            flags = ["-trimpath"]
            if target.tags:
                flags += ["-tags", target.tags]
            if target.ldflags:
                flags += ["-ldflags", target.ldflags]
            started = time.monotonic()
            if source is None:
                what = f"{module}/{target.package}@{version}"
                log(f"peers: go install {what} (log: {build_log})")
                args = [go, "install", *flags, what]
                reason = _run_go(args, _go_env(out, target.cgo), None, build_log)
            else:
                binary = out / Path(target.package).name
                log(f"peers: go build {module}/{target.package} {version} (log: {build_log})")
                args = [go, "build", "-mod=mod", *flags, "-o", str(binary), f"./{target.package}"]
                reason = _run_go(args, _go_env(None, target.cgo), source, build_log)
            if reason is not None:
                return reason
            log(f"peers:   {Path(target.package).name}: {time.monotonic() - started:.0f} s")
    finally:
        if source is not None:
            shutil.rmtree(source, ignore_errors=True)
    return None


def _containerd_targets(module: str, version: str) -> list[Target]:
    """containerd, its runc shim (static, as upstream ships it) and ctr (to import images)."""
    ldflags = f"-X {module}/version.Version={version}"
    return [
        Target("cmd/containerd", tags=CONTAINERD_TAGS, ldflags=ldflags),
        Target("cmd/containerd-shim-runc-v2", cgo=False, ldflags=ldflags),
        Target("cmd/ctr", tags=CONTAINERD_TAGS, ldflags=ldflags),
    ]


def _crictl(log: Log) -> Path | str:
    """crictl, built as the main module: `go install crictl@version` looks up the module's
    deprecation in its version list, which the proxy refuses for cri-tools (403)."""
    module = "sigs.k8s.io/cri-tools"
    ldflags = f"-X {module}/pkg/version.Version={CRICTL_VERSION.lstrip('v')}"
    built = _build(
        "crictl",
        module,
        CRICTL_VERSION,
        [Target("cmd/crictl", cgo=False, ldflags=ldflags)],
        log,
        as_main_module=True,
    )
    return built if isinstance(built, str) else built / "crictl"


def _runc() -> Path | str:
    runc = RUNC if os.access(RUNC, os.X_OK) else None
    if runc is None:
        return f"runc is not installed at {RUNC} (apt install runc)"
    return runc


def ensure_binaries(log: Log = _print) -> Binaries | str:
    """containerd 2.3, crictl and runc, built or found; the reason as a string when not."""
    runc = _runc()
    if isinstance(runc, str):
        return runc
    module = "github.com/containerd/containerd/v2"
    built = _build(
        "containerd",
        module,
        CONTAINERD_VERSION,
        _containerd_targets(module, CONTAINERD_VERSION),
        log,
    )
    if isinstance(built, str):
        return built
    crictl = _crictl(log)
    if isinstance(crictl, str):
        return crictl
    return Binaries(
        containerd=built / "containerd",
        shim=built / "containerd-shim-runc-v2",
        ctr=built / "ctr",
        runc=runc,
        crictl=crictl,
        containerd_version=CONTAINERD_VERSION,
        crictl_version=CRICTL_VERSION,
    )


def ensure_containerd_17(binaries: Binaries, log: Log = _print) -> Binaries | str:
    """`binaries` with containerd 1.7 swapped in (NRI v0.8), or why it cannot be had.

    Go refuses `go install` for 1.7 (its go.mod has an `exclude` directive), so it is built as
    the main module from a copy of its source; a failure is remembered (see `_build`).
    """
    module = "github.com/containerd/containerd"
    built = _build(
        "containerd",
        module,
        CONTAINERD_17_VERSION,
        _containerd_targets(module, CONTAINERD_17_VERSION),
        log,
        as_main_module=True,
        remember_failure=True,
    )
    if isinstance(built, str):
        return built
    return dataclasses.replace(
        binaries,
        containerd=built / "containerd",
        shim=built / "containerd-shim-runc-v2",
        ctr=built / "ctr",
        containerd_version=CONTAINERD_17_VERSION,
    )


if __name__ == "__main__":  # build ahead of a test run: python -m tests.harness.peers.building
    found = ensure_binaries()
    print(found)
    if not isinstance(found, str):
        print(ensure_containerd_17(found))
