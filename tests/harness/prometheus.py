"""A real Prometheus (Debian's binary) for a test: a private data directory, a free port, a
short scrape and evaluation interval, our rule file; stopped (by its own pid) at close."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.harness.daemon import free_port

__all__ = ["DASHBOARD", "RULES", "Prometheus", "find", "panel_queries"]

ROOT = Path(__file__).parents[2]
RULES = ROOT / "packaging" / "helm" / "hcs" / "files" / "prometheus-rules.yaml"
DASHBOARD = ROOT / "packaging" / "helm" / "hcs" / "files" / "dashboard.json"


def find(tool: str) -> str | None:
    """`prometheus` or `promtool` (Debian's package ships both in /usr/bin)."""
    return shutil.which(tool) or next((p for p in (f"/usr/bin/{tool}",) if Path(p).exists()), None)


def panel_queries(dashboard: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel of the dashboard, those in
    collapsed rows included (Grafana keeps a collapsed row's panels inside the row)."""
    found = json.loads(DASHBOARD.read_text()) if dashboard is None else dashboard

    def walk(panels: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [
            query
            for panel in panels
            for query in [(panel["title"], t["expr"]) for t in panel.get("targets", [])]
            + walk(panel.get("panels", []))
        ]

    return walk(found["panels"])


class Prometheus:
    def __init__(self, work: Path, jobs: dict[str, list[str]], interval: str = "1s") -> None:
        self.work = work
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
            ],
        }
        self.config = work / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, binary: str, timeout: float = 60) -> Prometheus:
        with open(self.work / "prometheus.log", "ab") as log:  # the child keeps its own copy
            self.process = subprocess.Popen(
                [binary, f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        path = self.work / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (a scalar as one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
