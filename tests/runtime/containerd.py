"""A real containerd with NRI on, in a scratch directory, driven through crictl as kubelet would.

Every path containerd uses (root, state, sockets, opt, NRI, runc's root, the shims' sockets,
pod logs, CNI) lives in the scratch directory, so the tests never touch a containerd the host may
run. Pods use the host network, so no CNI plugin is needed. What these machines need is set
explicitly: `restrict_oom_score_adj` (no CAP_SYS_RESOURCE in the bounding set: runc cannot give
the pause container its oom_score_adj of -998) and cgroupfs (`SystemdCgroup = false`: no systemd
on the test machines, cgroup v1 hybrid).

Every failure names the step that failed and ends with the last lines of containerd's log;
`close()` stops pods before containerd (their shims outlive it), then kills what is left, unmounts
what is still mounted under the scratch directories and removes the cgroups it created.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness import cgroups
from tests.harness.peers.runtimes import Binaries
from tests.runtime.image import BUSYBOX_IMAGE, PAUSE_IMAGE, ensure_busybox_image, ensure_pause_image

NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0

CONFIG_V3 = """\
# containerd {version}: every path in the scratch directory {d}
version = 3
imports = {imports}
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{grpc}"

[ttrpc]
  address = "{ttrpc}"

[debug]
  level = "{log_level}"

[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "{shim_sockets}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  # Required here: runc cannot set the pause container's oom_score_adj of -998 without
  # CAP_SYS_RESOURCE ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    conf_dir = "{d}/cni/net.d"
    bin_dirs = ["{d}/cni/bin"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = {passthrough}
      container_annotations = {passthrough}
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/runc"
        SystemdCgroup = false

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  disable_connections = {nri_disable_connections}
  socket_path = "{nri_socket}"
  plugin_path = "{nri_plugin_path}"
  plugin_config_path = "{nri_plugin_config_path}"
  plugin_registration_timeout = "{nri_registration_timeout}"
  plugin_request_timeout = "{nri_request_timeout}"
"""

# containerd 1.7: config version 2, the CRI plugin under one name, NRI off unless enabled here.
# Its shims put their sockets in the hard-coded /run/containerd/s: `_command` gives it a private
# /run/containerd (a bind mount of the scratch directory in its own mount namespace).
CONFIG_V2 = """\
# containerd {version}: every path in the scratch directory {d}
version = 2
imports = {imports}
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{grpc}"

[ttrpc]
  address = "{ttrpc}"

[debug]
  level = "{log_level}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "{d}/cni/net.d"
    bin_dir = "{d}/cni/bin"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = {passthrough}
      container_annotations = {passthrough}
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/runc"
        SystemdCgroup = false

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  disable_connections = {nri_disable_connections}
  socket_path = "{nri_socket}"
  plugin_path = "{nri_plugin_path}"
  plugin_config_path = "{nri_plugin_config_path}"
  plugin_registration_timeout = "{nri_registration_timeout}"
  plugin_request_timeout = "{nri_request_timeout}"
"""


class ContainerdError(Exception):
    """A step of running containerd failed; the message names it and ends with the log."""


class CrictlError(Exception):
    """crictl failed; `runtime_error` is the runtime's own text (what hcsd refusals look like).

    A plugin that fails CreateContainer makes creation fail with its message inside
    `runtime_error`, so `pytest.raises(CrictlError, match=...)` checks the refusal's wording.
    """

    def __init__(self, command: Sequence[str], returncode: int, stderr: str) -> None:
        self.command = list(command)
        self.returncode = returncode
        self.stderr = stderr
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {returncode}"
        logged = re.search(r'msg="((?:[^"\\]|\\.)*)"', last)  # crictl logs `level=fatal msg="…"`
        if logged is not None:
            with contextlib.suppress(ValueError):
                last = json.loads(f'"{logged.group(1)}"')
        self.runtime_error = last.split("desc = ", 1)[-1] if "desc = " in last else last
        super().__init__(f"crictl {' '.join(self.command)} failed: {self.runtime_error}")


@dataclass(frozen=True)
class Nri:
    """The NRI settings containerd gets (the keys of `plugins.'io.containerd.nri.v1.nri'`)."""

    socket_path: Path
    plugin_path: Path
    plugin_config_path: Path
    registration_timeout: str = "5s"
    request_timeout: str = "2s"
    disable_connections: bool = False


def _toml_list(values: Iterable[str]) -> str:
    return json.dumps(list(values))  # a JSON array of strings is a TOML array


class Containerd:
    """One containerd instance with its own state; use `launch()` then the CRI helpers.

    The fixture `containerd` in conftest.py yields a launched one and closes it afterwards.
    """

    def __init__(
        self,
        binaries: Binaries,
        directory: Path,
        *,
        nri_socket: Path | None = None,
        nri_plugin_path: Path | None = None,
        nri_plugin_config_path: Path | None = None,
        nri_registration_timeout: str = "5s",
        nri_request_timeout: str = "2s",
        nri_disable_connections: bool = False,
        annotation_passthrough: Sequence[str] = ("hcs.io/*",),
        log_level: str = "info",
        imports: Sequence[Path] = (),
    ) -> None:
        self.bin = binaries
        self.dir = directory.resolve()
        self.nri = Nri(
            socket_path=nri_socket or self.dir / "nri" / "nri.sock",
            plugin_path=nri_plugin_path or self.dir / "nri" / "plugins",
            plugin_config_path=nri_plugin_config_path or self.dir / "nri" / "conf.d",
            registration_timeout=nri_registration_timeout,
            request_timeout=nri_request_timeout,
            disable_connections=nri_disable_connections,
        )
        self.annotation_passthrough = tuple(annotation_passthrough)
        self.log_level = log_level
        # Config files merged over the generated one (what `hcsctl setup containerd` writes, a
        # [metrics] address, CDI spec directories).
        self.imports = tuple(Path(p).resolve() for p in imports)
        self.config = self.dir / "config.toml"
        self.grpc_socket = self.dir / "containerd.sock"
        self.ttrpc_socket = self.dir / "containerd-ttrpc.sock"
        self.log = self.dir / "containerd.log"
        self.runc_root = self.dir / "runc" / NAMESPACE
        self.crictl_config = self.dir / "crictl.yaml"
        # Shim sockets are named by a 64-digit hash: their directory needs a short path.
        self.shim_sockets: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._pod_configs: dict[str, Path] = {}
        self._execs = 0
        self._ids: set[str] = set()  # every pod and container made here: their cgroups go too
        for socket in (self.grpc_socket, self.ttrpc_socket, self.nri.socket_path):
            if len(str(socket)) > SOCKET_PATH_MAX:
                raise ContainerdError(f"socket path too long for a unix socket: {socket}")

    @property
    def nri_socket(self) -> Path:
        """Where containerd listens for external NRI plugins (hcsd connects here)."""
        return self.nri.socket_path

    # --- containerd itself -------------------------------------------------------------

    def launch(self) -> None:
        """Write the config, start containerd, wait for CRI, import the test images."""
        for sub in ("root", "state", "opt", "logs", "cni/net.d", "cni/bin", "pods", "run", "fifo"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for path in (self.nri.socket_path.parent, self.nri.plugin_path):
            path.mkdir(parents=True, exist_ok=True)
        self.nri.plugin_config_path.mkdir(parents=True, exist_ok=True)
        if self.shim_sockets is None:
            self.shim_sockets = Path(tempfile.mkdtemp(prefix="hcs-shim-", dir="/tmp"))
        self.config.write_text(self._config_text())
        self.crictl_config.write_text(
            f"runtime-endpoint: unix://{self.grpc_socket}\n"
            f"image-endpoint: unix://{self.grpc_socket}\n"
            "timeout: 30\ndebug: false\npull-image-on-create: false\n"
        )
        self._spawn()
        self._import_images()

    def _config_text(self) -> str:
        assert self.shim_sockets is not None
        template = CONFIG_V3 if self.bin.containerd_major >= 2 else CONFIG_V2
        return template.format(
            version=self.bin.containerd_version,
            d=self.dir,
            grpc=self.grpc_socket,
            ttrpc=self.ttrpc_socket,
            log_level=self.log_level,
            shim_sockets=self.shim_sockets,
            pause=PAUSE_IMAGE,
            runc=self.bin.runc,
            passthrough=_toml_list(self.annotation_passthrough),
            imports=_toml_list(str(p) for p in self.imports),
            nri_disable_connections=str(self.nri.disable_connections).lower(),
            nri_socket=self.nri.socket_path,
            nri_plugin_path=self.nri.plugin_path,
            nri_plugin_config_path=self.nri.plugin_config_path,
            nri_registration_timeout=self.nri.registration_timeout,
            nri_request_timeout=self.nri.request_timeout,
        )

    def _command(self) -> list[str]:
        containerd = [str(self.bin.containerd), "--config", str(self.config)]
        if self.bin.shim_dir_configurable:
            return containerd
        # containerd before 2.3 hard-codes /run/containerd/s for shim sockets: a private /run.
        script = (
            "mount -t tmpfs -o mode=0755 hcs-run /run && mkdir -p /run/containerd && "
            'mount --bind "$1" /run/containerd && shift && exec "$@"'
        )
        run = str(self.dir / "run")
        return [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            run,
            *containerd,
        ]

    def _spawn(self) -> None:
        """Start the containerd process and wait until CRI answers and the runtime is ready."""
        if self.process is not None and self.process.poll() is None:
            raise ContainerdError("failed to start containerd: it is already running")
        # containerd finds its shim on PATH: ours first.
        env = dict(
            os.environ, PATH=f"{self.bin.shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        )
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            log.write(
                f"\n=== {time.strftime('%H:%M:%S')} starting {self.bin.containerd}\n".encode()
            )
            log.flush()
            self.process = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C of pytest must not kill it before close()
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise self._failure(f"start containerd: it exited with {self.process.returncode}")
            if self.grpc_socket.exists() and self._runtime_ready():
                return
            if time.monotonic() > deadline:
                raise self._failure(f"start containerd: CRI not ready after {READY_TIMEOUT:.0f} s")
            time.sleep(0.05)

    def _runtime_ready(self) -> bool:
        try:
            result = self._run_crictl(["info"], timeout=5)
        except subprocess.TimeoutExpired:  # a busy machine: asked again until READY_TIMEOUT
            return False
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "RuntimeReady" and c.get("status") for c in conditions)

    def _import_images(self) -> None:
        present = {
            tag
            for image in self.crictl_json("images")["images"]
            for tag in image.get("repoTags", [])
        }
        for name, tarball in (
            (BUSYBOX_IMAGE, ensure_busybox_image()),
            (PAUSE_IMAGE, ensure_pause_image()),
        ):
            if name not in present:
                self.import_image(tarball)

    def import_image(self, tarball: Path) -> str:
        """`ctr -n k8s.io images import` of an OCI layout tarball (nothing is pulled); ctr's
        output, which names the image."""
        command = [
            str(self.bin.ctr), "--address", str(self.grpc_socket), "-n", NAMESPACE,
            "images", "import", str(tarball),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise self._failure(f"import {tarball} with ctr: {result.stderr.strip()}")
        return result.stdout + result.stderr

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of containerd's log, for failure messages."""
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _failure(self, step: str) -> ContainerdError:
        return ContainerdError(
            f"failed to {step}\n--- last lines of {self.log}:\n{self.log_tail()}"
        )

    def restart(self) -> None:
        """Stop containerd (pods keep running in their shims) and start it on the same state."""
        self._stop_daemon()
        self._spawn()

    def _stop_daemon(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --- crictl ------------------------------------------------------------------------

    def _run_crictl(
        self, args: Sequence[str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin.crictl), "--config", str(self.crictl_config), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)

    def crictl(self, *args: str, timeout: float = 60) -> str:
        """Run crictl against this containerd: its stdout, or CrictlError with the runtime's
        text."""
        result = self._run_crictl(args, timeout)
        if result.returncode != 0:
            raise CrictlError(args, result.returncode, result.stderr)
        return result.stdout

    def crictl_json(self, *args: str, timeout: float = 60) -> Any:
        """Run a crictl command that prints JSON (`-o json` is added) and parse it."""
        command, *rest = args  # urfave/cli: flags before the positional arguments
        return json.loads(self.crictl(command, "-o", "json", *rest, timeout=timeout))

    # --- pods --------------------------------------------------------------------------

    def run_pod(
        self,
        name: str,
        namespace: str = "default",
        uid: str | None = None,
        *,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Run a pod sandbox on the host network (no CNI, no hostname); its id."""
        uid = uid or f"uid-{namespace}-{name}"
        config = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "attempt": 0},
            "log_directory": str(self.dir / "logs" / f"{namespace}_{name}_{uid}"),
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
            "linux": {"security_context": {"namespace_options": {"network": 2}}},  # NODE
        }
        path = self.dir / "pods" / f"{namespace}_{name}_{uid}.json"
        path.write_text(json.dumps(config, indent=1))
        pod_id = self.crictl("runp", str(path)).strip()
        self._pod_configs[pod_id] = path
        self._ids.add(pod_id)
        return pod_id

    def stop_pod(self, pod_id: str) -> None:
        self.crictl("stopp", pod_id)

    def remove_pod(self, pod_id: str) -> None:
        self.crictl("rmp", "--force", pod_id)

    def inspect_pod(self, pod_id: str) -> dict[str, Any]:
        """`crictl inspectp`: the sandbox status and, under `info`, containerd's view of it."""
        result: dict[str, Any] = self.crictl_json("inspectp", pod_id)
        return result

    # --- containers --------------------------------------------------------------------

    def create_container(
        self,
        pod_id: str,
        name: str,
        *,
        command: Sequence[str] | None = None,
        args: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        image: str = BUSYBOX_IMAGE,
        mounts: Sequence[tuple[Path, str]] = (),
        user: tuple[int, int] | None = None,
        seccomp: str | None = None,
        cdi_devices: Sequence[str] = (),
    ) -> str:
        """Create a container in `pod_id`; its id, or CrictlError with the runtime's text.

        The default command sleeps for an hour so that a started container stays running.
        `mounts` are read-only host paths (host, container), as a pod's hostPath volumes;
        `user` is (uid, gid), as a pod's `runAsUser` and `runAsGroup`; `seccomp`
        "runtime/default" is a pod's `seccompProfile: RuntimeDefault` (unset: unconfined).
        `cdi_devices` are CDI ids in CRI's own field, as kubelet passes a DRA claim's devices.
        """
        context: dict[str, Any] = {}
        if user is not None:
            context["run_as_user"] = {"value": user[0]}
            context["run_as_group"] = {"value": user[1]}
        if seccomp == "runtime/default":
            context["seccomp"] = {"profile_type": 0}  # CRI SecurityProfile.RuntimeDefault
        elif seccomp is not None:
            raise ContainerdError(f"failed to create container {name}: seccomp {seccomp!r}?")
        linux: dict[str, Any] = {"security_context": context} if context else {}
        if pod_id not in self._pod_configs:
            raise ContainerdError(
                f"failed to create container {name}: pod {pod_id} was not run here"
            )
        config = {
            "metadata": {"name": name, "attempt": 0},
            "image": {"image": image},
            "command": list(command) if command is not None else ["sleep", "3600"],
            "args": list(args or []),
            "envs": [{"key": key, "value": value} for key, value in (env or {}).items()],
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
            "log_path": f"{name}.log",
            "mounts": [
                {"host_path": str(host), "container_path": inside, "readonly": True}
                for host, inside in mounts
            ],
            "linux": linux,
        }
        if cdi_devices:
            config["CDI_devices"] = [{"name": name} for name in cdi_devices]
        path = self.dir / "pods" / f"{pod_id[:12]}_{name}.json"
        path.write_text(json.dumps(config, indent=1))
        container_id = self.crictl(
            "create", "--no-pull", pod_id, str(path), str(self._pod_configs[pod_id])
        ).strip()
        self._ids.add(container_id)
        return container_id

    def start(self, container_id: str) -> None:
        self.crictl("start", container_id)

    def inspect(self, container_id: str) -> dict[str, Any]:
        """`crictl inspect`: `status` (CRI) and `info` (containerd's; `info.runtimeSpec` is the
        OCI spec runc got, with everything NRI plugins adjusted)."""
        result: dict[str, Any] = self.crictl_json("inspect", container_id)
        return result

    def runtime_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec of the container (`info.runtimeSpec` of `inspect`)."""
        spec: dict[str, Any] = self.inspect(container_id)["info"]["runtimeSpec"]
        return spec

    def state(self, container_id: str) -> str:
        """CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED or CONTAINER_UNKNOWN."""
        return str(self.inspect(container_id)["status"]["state"])

    def wait_exited(self, container_id: str, timeout: float = 10) -> int:
        """Wait until the container has exited; its exit code."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.inspect(container_id)["status"]
            if status["state"] == "CONTAINER_EXITED":
                return int(status.get("exitCode", 0))
            if time.monotonic() > deadline:
                raise ContainerdError(
                    f"container {container_id[:12]} still {status['state']} after {timeout} s"
                )
            time.sleep(0.05)

    def exec(
        self, container_id: str, *cmd: str, timeout: float = 10, user: str | None = None
    ) -> tuple[int, str]:
        """Run `cmd` in the running container; its exit code and stdout (stderr is dropped).

        Through `ctr tasks exec` rather than crictl: `crictl exec --sync` loses the exit code
        of a failing command and prints stderr into stdout, and the streaming exec loses the
        code too. The process gets the container's environment and working directory, and
        runs as `user` ("uid:gid") when given, else as the container's user.
        """
        self._execs += 1
        command = [
            str(self.bin.ctr), "--address", str(self.grpc_socket), "-n", NAMESPACE,
            "tasks", "exec", "--fifo-dir", str(self.dir / "fifo"),
            "--exec-id", f"hcs-exec-{os.getpid()}-{self._execs}",
            *(["--user", user] if user is not None else []), container_id, *cmd,
        ]  # fmt: skip
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0 and result.stderr.startswith("ctr: "):
            raise CrictlError(["exec", container_id, *cmd], result.returncode, result.stderr)
        return result.returncode, result.stdout

    def logs(self, container_id: str) -> str:
        """What the container wrote to stdout and stderr (from its CRI log file)."""
        result = self._run_crictl(["logs", container_id])
        if result.returncode != 0:
            raise CrictlError(["logs", container_id], result.returncode, result.stderr)
        return result.stdout + result.stderr

    def stop_container(self, container_id: str, timeout: int = 5) -> None:
        self.crictl("stop", "--timeout", str(timeout), container_id)

    def remove_container(self, container_id: str) -> None:
        self.crictl("rm", "--force", container_id)

    # --- cleanup -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop and remove pods (while containerd runs), stop containerd, then clean up after it.

        Cleanup goes on past failures and raises one ContainerdError listing them at the end.
        """
        problems: list[str] = []
        if self.running:
            problems += self._remove_pods()
        self._stop_daemon()
        problems += self._kill_leftovers()
        problems += self._unmount_leftovers()
        self._remove_cgroups()
        if self.shim_sockets is not None:
            shutil.rmtree(self.shim_sockets, ignore_errors=True)
        if problems:
            raise ContainerdError(
                "failed to clean up after containerd: "
                + "; ".join(problems)
                + f"\n--- last lines of {self.log}:\n{self.log_tail()}"
            )

    def _remove_pods(self) -> list[str]:
        problems = []
        with contextlib.suppress(CrictlError, json.JSONDecodeError):
            self._ids.update(c["id"] for c in self.crictl_json("ps", "--all")["containers"])
        try:
            pods = [p["id"] for p in self.crictl_json("pods")["items"]]
        except (CrictlError, json.JSONDecodeError) as e:
            return [f"listing pods: {e}"]
        self._ids.update(pods)
        for pod in pods:
            for step in ("stopp", "rmp"):
                result = self._run_crictl([step, pod])
                if result.returncode != 0:
                    problems.append(f"crictl {step} {pod[:12]}: {result.stderr.strip()[-300:]}")
                    break
        return problems

    def _kill_leftovers(self) -> list[str]:
        """Containers runc still knows, then shims that name our socket; by pid, never by name."""
        problems = []
        if self.runc_root.exists():
            runc = [str(self.bin.runc), "--root", str(self.runc_root)]
            listed = subprocess.run(
                [*runc, "list", "-q"], capture_output=True, text=True, check=False
            )
            for container in listed.stdout.split():
                self._ids.add(container)
                subprocess.run(
                    [*runc, "delete", "--force", container], capture_output=True, check=False
                )
        address = str(self.grpc_socket)
        for pid in _pids_with_argument(address):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (left := _pids_with_argument(address)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            problems.append(f"processes naming {address} survived SIGKILL: {left}")
        return problems

    def _unmount_leftovers(self) -> list[str]:
        roots = [str(self.dir)] + ([str(self.shim_sockets)] if self.shim_sockets else [])
        problems = []
        for mountpoint in sorted(_mountpoints_under(roots), key=len, reverse=True):
            result = subprocess.run(
                ["umount", "-l", mountpoint], capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                problems.append(f"umount {mountpoint}: {result.stderr.strip()}")
        return problems

    def _remove_cgroups(self) -> None:
        """Remove our pods' and containers' cgroups, then `k8s.io` itself once it is empty.

        Only empty directories go (rmdir), so a concurrent containerd's cgroups stay.
        """
        for parent in (hierarchy / NAMESPACE for hierarchy in cgroups.hierarchies()):
            for container in self._ids:
                with contextlib.suppress(OSError):
                    (parent / container).rmdir()
            with contextlib.suppress(OSError):
                parent.rmdir()

    def __enter__(self) -> Containerd:
        """Launch; on failure clean up at once (no `__exit__` runs then) and re-raise."""
        try:
            self.launch()
        except BaseException:
            with contextlib.suppress(ContainerdError):  # the launch failure is the one to see
                self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _pids_with_argument(argument: str) -> list[int]:
    """Processes with `argument` in their command line (our shims: `-address <socket>`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in argv:
            found.append(int(entry.name))
    return found


def _mountpoints_under(roots: Sequence[str]) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == root or point.startswith(root + "/") for root in roots):
            points.append(point)
    return points


def is_socket(path: Path) -> bool:
    """True when `path` exists and is a unix socket (what NRI's socket_path becomes)."""
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except FileNotFoundError:
        return False
