"""Building a peer from its Go module once, and finding it in the cache afterwards.

A build goes to `PEERS/.<name>-<version>.partial`, gets a `BUILT` record, and is renamed to
`PEERS/<name>-<version>` only when complete, so an interrupted build is never taken for a
finished one. Builds are serialised with a file lock so that two pytest workers (or a test
run and a benchmark) never build the same thing twice, and they say what they do: a cold
build takes minutes. A peer that cannot be had comes back as the reason, a string, so that
tests skip loudly instead of passing silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("HCS_CACHE", str(Path.home() / ".cache" / "hcs")))
PEERS = CACHE / "peers"
GO_CACHE = CACHE / "go"
GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
BUILD_TIMEOUT = 1800.0

Log = Callable[[str], None]
#: build(go, into, build_log): put the binaries into `into`; None, or why it failed.
Build = Callable[[str, Path, Path], str | None]


def say(message: str) -> None:
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


def go_env(gobin: Path | None = None, cgo: bool | None = None) -> dict[str, str]:
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


def run_go(args: list[str], env: dict[str, str], cwd: Path | None, log_file: Path) -> str | None:
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


def download_module(go: str, module: str, version: str) -> dict[str, Any] | str:
    """`go mod download -json module@version`: where its source (`Dir`) and go.mod (`GoMod`)
    are in the module cache, or why it could not be had."""
    found = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        env=go_env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if found.returncode != 0:
        return (
            f"`go mod download {module}@{version}` failed: {(found.stdout + found.stderr)[-800:]}"
        )
    described: dict[str, Any] = json.loads(found.stdout)
    return described


def _complete(directory: Path, binaries: Sequence[str]) -> bool:
    return (directory / "BUILT").exists() and all(
        os.access(directory / name, os.X_OK) for name in binaries
    )


def cached(
    name: str,
    version: str,
    binaries: Sequence[str],
    build: Build,
    log: Log,
    *,
    remember_failure: bool = False,
    record: Mapping[str, object] | None = None,
) -> Path | str:
    """PEERS/<name>-<version> holding `binaries`: found, or built now by `build`; else why not.

    `remember_failure` keeps the reason in `<name>-<version>.failed` so that an optional peer
    that cannot be built does not cost minutes on every run (delete the file to try again).
    `record` goes into the BUILT file with the Go version and the build's seconds.
    """
    final = PEERS / f"{name}-{version}"
    failed = PEERS / f"{name}-{version}.failed"
    if _complete(final, binaries):
        return final
    with build_lock():
        if _complete(final, binaries):  # another process built it while we waited
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
        reason = build(go, staging, build_log)
        missing = [b for b in binaries if not os.access(staging / b, os.X_OK)]
        if reason is None and missing:
            reason = f"built nothing for {missing}"
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
        seconds = round(time.monotonic() - started, 1)
        built = {**(record or {}), "version": version, "go": go_version, "seconds": seconds}
        (staging / "BUILT").write_text(json.dumps(built) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        log(f"peers: {name} {version} built in {seconds:.0f} s -> {final}")
        return final


@dataclass(frozen=True)
class Target:
    """One binary to build: a package of the module and how."""

    package: str  # relative to the module root, e.g. "cmd/containerd"
    tags: str = ""
    cgo: bool | None = None  # None: Go's default
    ldflags: str = ""


def module_build(
    module: str, version: str, targets: Sequence[Target], log: Log, *, as_main_module: bool
) -> Build:
    """Building `targets` of `module@version`: `go install pkg@version`, or with
    `as_main_module` `go build` in a copy of the module's source, for modules whose go.mod
    has `exclude` or `replace` directives (Go refuses `go install` for those)."""

    def build(go: str, out: Path, build_log: Path) -> str | None:
        source: Path | None = None
        if as_main_module:
            log(f"peers: downloading {module}@{version} to build it as the main module")
            found = download_module(go, module, version)
            if isinstance(found, str):
                return found
            source = out.parent / f".{out.name}-src"
            shutil.rmtree(source, ignore_errors=True)
            shutil.copytree(found["Dir"], source)
            for path in [source, *source.rglob("*")]:  # the module cache is read-only
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
        try:
            for target in targets:
                reason = _build_target(go, module, version, target, out, source, build_log, log)
                if reason is not None:
                    return reason
        finally:
            if source is not None:
                shutil.rmtree(source, ignore_errors=True)
        return None

    return build


def _build_target(
    go: str,
    module: str,
    version: str,
    target: Target,
    out: Path,
    source: Path | None,
    build_log: Path,
    log: Log,
) -> str | None:
    flags = ["-trimpath"]
    if target.tags:
        flags += ["-tags", target.tags]
    if target.ldflags:
        flags += ["-ldflags", target.ldflags]
    started = time.monotonic()
    if source is None:
        what = f"{module}/{target.package}@{version}"
        log(f"peers: go install {what} (log: {build_log})")
        reason = run_go([go, "install", *flags, what], go_env(out, target.cgo), None, build_log)
    else:
        binary = out / Path(target.package).name
        log(f"peers: go build {module}/{target.package} {version} (log: {build_log})")
        args = [go, "build", "-mod=mod", *flags, "-o", str(binary), f"./{target.package}"]
        reason = run_go(args, go_env(None, target.cgo), source, build_log)
    if reason is None:
        log(f"peers:   {Path(target.package).name}: {time.monotonic() - started:.0f} s")
    return reason
