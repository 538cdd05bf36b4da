"""A real containerd (with NRI on) in a scratch directory, driven through CRI as kubelet does.

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

from tests.runtime.cri import Cri, CriError
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
        self.sandboxes: dict[str, object] = {}
        self.cri: Cri | None = None

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
            if self.socket.exists() and self._ready():
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

    def _ready(self) -> bool:
        if self.cri is None:
            self.cri = Cri(self.socket)
        try:
            self.cri.call("Version", timeout=2)
        except CriError:
            return False
        return True

    def _pb(self) -> object:
        assert self.cri is not None
        return self.cri.pb

    def run_pod(
        self, name: str, namespace: str, uid: str, annotations: dict[str, str] | None = None
    ) -> str:
        assert self.cri is not None
        pb = self.cri.pb
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=1),
            log_directory=str(self.dir / "logs" / name),
            annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE)
                )
            ),
        )
        pod = str(self.cri.call("RunPodSandbox", config=config).pod_sandbox_id)
        self.pods.append(pod)
        self.sandboxes[pod] = config
        return pod

    def create_container(
        self,
        pod: str,
        pod_name: str,
        name: str,
        command: list[str],
        annotations: dict[str, str] | None = None,
    ) -> str:
        assert self.cri is not None
        pb = self.cri.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name),
            image=pb.ImageSpec(image=SHELL_IMAGE),
            command=command,
            log_path=f"{name}.log",
            annotations=annotations or {},
        )
        response = self.cri.call(
            "CreateContainer", pod_sandbox_id=pod, config=config, sandbox_config=self.sandboxes[pod]
        )
        return str(response.container_id)

    def start_container(self, container: str) -> None:
        assert self.cri is not None
        self.cri.call("StartContainer", container_id=container)

    def stop(self, container: str) -> None:
        assert self.cri is not None
        self.cri.call("StopContainer", container_id=container, timeout=5)

    def remove(self, container: str) -> None:
        assert self.cri is not None
        self.cri.call("RemoveContainer", container_id=container)

    def inspect(self, container: str) -> dict[str, object]:
        """The runtime's verbose status: `info` holds the OCI spec it generated."""
        assert self.cri is not None
        response = self.cri.call("ContainerStatus", container_id=container, verbose=True)
        return {"status": response.status, "info": json.loads(response.info["info"])}

    def logs(self, container: str) -> str:
        """The container's output from its CRI log file (`<time> <stream> <tag> <line>`)."""
        status = self.inspect(container)["status"]
        path = Path(status.log_path)  # type: ignore[attr-defined]
        if not path.exists():
            return ""
        return "\n".join(line.split(" ", 3)[-1] for line in path.read_text().splitlines())

    def restart(self) -> None:
        """Stop containerd (pods keep running in their shims) and start it on the same state."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        if self.cri is not None:
            self.cri.close()
            self.cri = None
        self.start()

    def close(self) -> None:
        for pod in self.pods:
            for method in ("StopPodSandbox", "RemovePodSandbox"):
                if self.cri is not None:
                    with contextlib.suppress(CriError):
                        self.cri.call(method, pod_sandbox_id=pod)
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
