"""A real containerd (with NRI on) in a scratch directory, driven through CRI with crictl.

Every path lives under the scratch directory, so nothing touches a containerd the host may run.
Pods use the host network (no CNI needed). `restrict_oom_score_adj` is set because these
machines lack CAP_SYS_RESOURCE for the pause container's oom_score_adj.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.runtime.image import PAUSE_IMAGE, SHELL_IMAGE, build_image
from tests.runtime.peers import CACHE, Binaries

CONFIG = """version = 3
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd-ttrpc.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "{d}/s"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{d}/runc"
        SystemdCgroup = false
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "{nri}"
  plugin_path = "{d}/nri-plugins"
  plugin_config_path = "{d}/nri-conf"
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
"""


class Containerd:
    def __init__(self, binaries: Binaries, directory: Path) -> None:
        self.bin = binaries
        self.dir = directory
        self.nri_socket = directory / "nri" / "nri.sock"
        self.config = directory / "config.toml"
        self.socket = directory / "containerd.sock"
        self.log = directory / "containerd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.pods: list[str] = []

    def start(self) -> None:
        for sub in ("nri", "nri-plugins", "nri-conf", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            CONFIG.format(d=self.dir, pause=PAUSE_IMAGE, runc=self.bin.runc, nri=self.nri_socket)
        )
        env = dict(os.environ, PATH=f"{self.bin.shim.parent}:{os.environ['PATH']}")
        with open(self.log, "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [str(self.bin.containerd), "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"containerd exited:\n{self.tail()}")
            if self.socket.exists() and self._crictl_ok("info"):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"containerd did not answer CRI in 30 s:\n{self.tail()}")
        images = CACHE / "images"
        shell = build_image(images / "busybox.tar", SHELL_IMAGE, ["sh"])
        pause = build_image(
            images / "pause.tar",
            PAUSE_IMAGE,
            ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        )
        for tarball in (shell, pause):
            subprocess.run(
                [
                    str(self.bin.ctr),
                    "--address",
                    str(self.socket),
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    str(tarball),
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _crictl_ok(self, *args: str) -> bool:
        return (
            subprocess.run(
                self._crictl_cmd(*args), capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )

    def _crictl_cmd(self, *args: str) -> list[str]:
        return [
            str(self.bin.crictl),
            "--runtime-endpoint",
            f"unix://{self.socket}",
            "--image-endpoint",
            f"unix://{self.socket}",
            "--timeout",
            "20s",
            *args,
        ]

    def crictl(self, *args: str) -> str:
        result = subprocess.run(
            self._crictl_cmd(*args), capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode != 0:
            raise CrictlError(result.stderr.strip() or result.stdout.strip())
        return result.stdout.strip()

    def run_pod(
        self, name: str, namespace: str, uid: str, annotations: dict[str, str] | None = None
    ) -> str:
        spec = self.dir / f"pod-{name}.json"
        spec.write_text(
            json.dumps(
                {
                    "metadata": {"name": name, "namespace": namespace, "uid": uid, "attempt": 1},
                    "log_directory": str(self.dir / "logs" / name),
                    "annotations": annotations or {},
                    "linux": {"security_context": {"namespace_options": {"network": 2}}},
                }
            )
        )
        pod = self.crictl("runp", str(spec))
        self.pods.append(pod)
        return pod

    def create_container(
        self,
        pod: str,
        pod_name: str,
        name: str,
        command: list[str],
        annotations: dict[str, str] | None = None,
    ) -> str:
        spec = self.dir / f"ctr-{pod_name}-{name}.json"
        spec.write_text(
            json.dumps(
                {
                    "metadata": {"name": name},
                    "image": {"image": SHELL_IMAGE},
                    "command": command,
                    "log_path": f"{name}.log",
                    "annotations": annotations or {},
                }
            )
        )
        return self.crictl("create", pod, str(spec), str(self.dir / f"pod-{pod_name}.json"))

    def inspect(self, container: str) -> dict[str, object]:
        return json.loads(self.crictl("inspect", container))  # type: ignore[no-any-return]

    def logs(self, container: str) -> str:
        return self.crictl("logs", container)

    def restart(self) -> None:
        """Stop containerd (pods keep running in their shims) and start it on the same state."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        self.start()

    def close(self) -> None:
        for pod in self.pods:
            for verb in ("stopp", "rmp"):
                with contextlib.suppress(CrictlError, subprocess.TimeoutExpired):
                    self.crictl(verb, pod)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        subprocess.run(["pkill", "-f", f"containerd-shim-runc-v2.*{self.dir}"], check=False)
        for cgroup in Path("/sys/fs/cgroup").glob("*/k8s.io"):
            try:
                for child in sorted(cgroup.rglob("*"), reverse=True):
                    if child.is_dir():
                        child.rmdir()
                cgroup.rmdir()
            except OSError:
                pass


class CrictlError(Exception):
    """crictl failed; the message is the runtime's own error text."""
