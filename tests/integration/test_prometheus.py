"""A real Prometheus server scrapes a live 2-rank run's `--metrics` endpoint: both ranks' series
arrive, their steps go up, the last-step timestamp (what an alert reads) is recent, every series
carries the run's id and joins `ringtop_run_info` on it, the totals are typed counters, and the
port is gone when the run ends. Skipped where the `prometheus` binary is not installed (CI installs
Debian's package: see .ci/run)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import poll_until

from ringtop.agent.lifecycle import exit_with_parent
from ringtop.protocol import free_tcp_port

pytest.importorskip("prometheus_client")
PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)"),
]


class PrometheusServer:
    def __init__(self, workdir: Path, target: str) -> None:
        self.port = free_tcp_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: ringtop\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as out:
            # no lifecycle or admin API, no remote write, local storage only: it reaches nothing but the target
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True,
                preexec_fn=exit_with_parent)

    def query(self, expr: str) -> list[dict]:
        """The instant vector of `expr`; [] while Prometheus is not up yet."""
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.proc.returncode}):\n{self.output()}")
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                body = json.load(reply)
        except OSError:
            return []
        assert body["status"] == "success", body
        return body["data"]["result"]

    def metadata(self) -> dict[str, str]:
        """Metric family name -> its type, as Prometheus read it from the exposition."""
        with urllib.request.urlopen(f"{self.url}/api/v1/metadata", timeout=5) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return {name: entries[0]["type"] for name, entries in body["data"].items()}

    def by_rank(self, expr: str) -> dict[str, float]:
        return {r["metric"].get("rank", ""): float(r["value"][1]) for r in self.query(expr)}

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def prometheus(tmp_path):
    """start(target) -> PrometheusServer scraping HOST:PORT every second; stopped at teardown."""
    servers: list[PrometheusServer] = []

    def start(target: str) -> PrometheusServer:
        server = PrometheusServer(tmp_path, target)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_prometheus_scrapes_both_ranks_of_a_live_run(launch_agents, prometheus):
    metrics_port = free_tcp_port()
    prom = prometheus(f"127.0.0.1:{metrics_port}")
    run = launch_agents(2, "--steps", "0", "--metrics", f"127.0.0.1:{metrics_port}")

    def detail() -> str:
        return f"prometheus:\n{prom.output()}\nrun:\n{run.output()[-3000:]}"

    def both_ranks():
        if run.proc.poll() is not None:
            raise AssertionError(f"run exited ({run.proc.returncode}):\n{run.output()[-3000:]}")
        steps = prom.by_rank("ringtop_step")
        return steps if set(steps) == {"0", "1"} else None

    first = poll_until(both_ranks, 60, "both ranks' ringtop_step in Prometheus", interval_s=0.5, detail=detail)

    def increased() -> bool:
        now = both_ranks()
        return now is not None and all(now[r] > first[r] for r in first)

    poll_until(increased, 30, f"ringtop_step increasing on both ranks from {first}", interval_s=0.5, detail=detail)

    age = prom.by_rank("time() - ringtop_last_step_timestamp_seconds")
    assert set(age) == {"0", "1"} and all(-5 < a < 15 for a in age.values()), age
    assert prom.by_rank("ringtop_up") == {"0": 1.0, "1": 1.0}
    assert {r["metric"]["kind"] for r in prom.query("ringtop_comm_bytes_total")} >= {"all_reduce"}
    hosts = {r["metric"]["host"] for r in prom.query("ringtop_step")}
    assert hosts == {socket.gethostname()[:128]}
    (goodput,) = [float(r["value"][1]) for r in prom.query("ringtop_goodput_ratio")]
    assert 0.0 < goodput <= 1.0
    # every series carries the run's id, and ringtop_run_info joins on it
    (info,) = prom.query("ringtop_run_info")
    run_id = info["metric"]["run_id"]
    assert run_id and {r["metric"].get("run_id") for r in prom.query('{__name__=~"ringtop_.+"}')} == {run_id}
    joined = prom.query("ringtop_step * on(run_id) group_left(strategy) ringtop_run_info")
    assert {(r["metric"]["rank"], r["metric"]["strategy"]) for r in joined} == {("0", "ddp"), ("1", "ddp")}
    # the seconds that only go up are counters, named *_total; a rate over them is goodput
    types = prom.metadata()
    for name in ("ringtop_goodput_productive_seconds", "ringtop_goodput_wall_seconds",
                 "ringtop_goodput_lost_seconds", "ringtop_exposed_comm_seconds", "ringtop_comm_bytes"):
        assert types.get(name) == "counter", (name, types.get(name))
    assert types.get("ringtop_step_seconds") == "gauge" and "ringtop_tflops" not in types
    assert {r["metric"]["cause"] for r in prom.query("ringtop_goodput_lost_seconds_total")} >= {"startup"}

    assert list(run.send_command("stop", {}))[-1].status == "done"
    assert run.wait(60) == 0, run.output()[-3000:]
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", metrics_port))  # the endpoint ended with the run
