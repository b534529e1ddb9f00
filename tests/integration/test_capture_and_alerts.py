"""A real 3-rank run (gloo) with a slow rank and a NaN: `--capture-on straggler` profiles the
straggler and one healthy rank (not the third), the traces land in the run folder and in `ringtop
trace`; `--alert-webhook` gets exactly one opening and one resolution for the non-finite step,
from a real HTTP server on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import agent_env, finished_agents


@pytest.fixture
def webhook():
    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies
    server.shutdown()
    server.server_close()


@pytest.mark.timeout(300)
def test_a_straggler_is_profiled_beside_a_healthy_rank_and_a_nan_alerts_once_each_way(tmp_path, webhook):
    url, bodies = webhook
    run = finished_agents(tmp_path / "run", 3, "--steps", "90", "--batch-size", "2", "--seq-len", "16",
                          "--inject-slow-rank", "1:150", "--capture-on", "straggler", "--capture-steps", "2",
                          "--inject-nan", "2:6", "--on-nonfinite", "skip-step", "--alert-webhook", url,
                          timeout_s=280)
    profiles = sorted(p.name for p in (run.log_dir / "profile").glob("step-*-rank-*.json"))
    assert {name.rsplit("-", 1)[1] for name in profiles} == {"0.json", "1.json"}, profiles  # not rank 2
    events = [m for m in run.messages(0) if getattr(m, "kind", "") in ("capture", "profile")]
    capture = [e for e in events if e.kind == "capture"]
    assert len(capture) == 1 and capture[0].data["ranks"] == [1, 0], capture
    assert any("on ranks 0, 1 (capture on straggler:" in e.text for e in events if e.kind == "profile")
    trace = subprocess.run([sys.executable, "-m", "ringtop.cli", "trace", str(run.log_dir), "-o", "-"],
                           capture_output=True, text=True, timeout=120, env=agent_env())
    assert trace.returncode == 0, trace.stderr
    doc = json.loads(trace.stdout)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events), "the captured traces' steps"
    lanes = {e["args"]["name"].split(" (")[0] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
             and "profiler" in e["args"].get("name", "")}
    assert lanes == {"rank 0 profiler", "rank 1 profiler"}, lanes
    nonfinite = [b["ringtop"] for b in bodies if b["ringtop"]["kind"] == "nonfinite"]
    assert [(b["action"], b["ranks"]) for b in nonfinite] == [("opened", [2]), ("resolved", [2])], bodies
    assert all(b["text"] for b in bodies) and all(b["ringtop"]["run_id"] == run.run_id for b in bodies)
