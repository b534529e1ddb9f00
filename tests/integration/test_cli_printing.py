"""Nothing the `ringtop` command prints can drive the terminal: every printer, fed hostile strings
through its real inputs (logs, connection files, a checkpoint's meta, a control reply over a real
socket, arguments), prints no control byte; and a closed pipe ends a command quietly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringtop.cli.main import main
from ringtop.protocol import Bye, Command, Event, Hello, Reply, Step, decode, encode, free_tcp_port, to_json_line
from ringtop.protocol.connection_file import RUNTIME_ENV
from ringtop.protocol.text_safety import json_safe, printable, visible

pytestmark = pytest.mark.timeout(120)

PWNED = "\x1b]2;PWNED\x07\x1b[2J"
BIDI = "\u202e\u2066"
DANGEROUS = [PWNED, "\x1b[31m", "\x9b2J", "\x07", "\r", "\x08", "\x7f", "\x85", "\x00", BIDI, "\x1bP", "\u2069"]


def forbidden(text: str) -> list[str]:
    """Every character of `text` a terminal acts on rather than shows: C0 but newline and tab,
    DEL, C1, and the bidi embeddings, overrides and isolates."""
    return [ch for ch in text if (ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) <= 0x9F
            or 0x202A <= ord(ch) <= 0x202E or 0x2066 <= ord(ch) <= 0x2069]


_pieces = st.lists(st.sampled_from(DANGEROUS) | st.text(st.characters(max_codepoint=0x20FF, exclude_categories=["Cs"]),
                                                         max_size=6), max_size=5).map("".join)
hostile = st.tuples(_pieces, st.sampled_from(DANGEROUS), _pieces).map("".join)
"""Any text with at least one thing a terminal would act on in it."""
HOSTILE_SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                            database=None, derandomize=True)


def test_printable_escapes_every_control_character_and_keeps_lines():
    assert printable("plain ünïcode ✓\n\tcolumns") == "plain ünïcode ✓\n\tcolumns"
    assert printable(f"a{PWNED}b\x9b\r\u202e") == "a\\x1b]2;PWNED\\x07\\x1b[2Jb\\x9b\\x0d\\u202e"
    assert not forbidden(printable("".join(map(chr, range(0x2100)))))
    assert visible("x\u2067y") == "x\\u2067y"  # the UI's rules are the same ones


def test_json_safe_keeps_the_value_and_escapes_what_json_lets_through():
    value = {"path": f"/ck{PWNED}\x85\x7f{BIDI}é"}
    text = json_safe(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value and not forbidden(text)


@pytest.mark.parametrize("rule", [printable, json_safe])
def test_sanitizers_bite_on_each_dangerous_character(rule):
    """Each character of the list, alone, is something the check sees raw and the sanitizer removes."""
    for ch in DANGEROUS:
        assert forbidden(ch) and not forbidden(rule(ch)), ascii(ch)


def write_run_log(log_dir: Path, text: str) -> None:
    """Rank 0's log of a run that failed: its stop reason, a diagnosis and a hang event all carry `text`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    msgs = [Hello(rank=0, seq=0, ts=1.0, run_id="r", world_size=1, strategy=f"ddp{text}", host=f"h{text}"),
            Step(rank=0, seq=1, ts=2.0, step=1, loss=2.0, step_ms=10.0),
            Step(rank=0, seq=2, ts=3.0, step=2, loss=1.9, step_ms=11.0),
            Event(rank=0, seq=3, ts=3.5, kind="diagnosis", text="d",
                  data={"verdicts": [{"text": f"slow{text}", "advice": f"fix{text}"}]}),
            Event(rank=0, seq=4, ts=3.6, level="error", kind="hang", text=f"rank 1 waits{text}",
                  data={"verdict": "hang"}),
            Bye(rank=0, seq=5, ts=4.0, ok=False, reason=f"stopped: {text}")]
    (log_dir / "rank-0.jsonl").write_bytes(b"".join(to_json_line(m) for m in msgs))


def write_connection_file(runtime: Path, text: str) -> None:
    runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = {"run_id": f"ab{text}", "pid": os.getpid(), "host": socket.gethostname(),
            "publish": f"tcp://127.0.0.1:1{text}", "control": "tcp://127.0.0.1:2", "log_dir": f"runs/{text}",
            "checkpoint_dir": f"ck{text}", "world_size": 2, "keys": None}
    path = runtime / "run-hostile.json"
    path.write_text(json.dumps(info, ensure_ascii=False))
    path.chmod(0o600)


def printed(capsys, argv: list[str]) -> str:
    try:
        main(argv)
    except SystemExit:
        pass  # argparse's own exits print first
    out = capsys.readouterr()
    return out.out + out.err


@HOSTILE_SETTINGS
@given(text=hostile)
def test_summary_prints_hostile_logs_inert(text, tmp_path, capsys):
    log_dir = Path(tempfile.mkdtemp(dir=tmp_path))
    write_run_log(log_dir, text)
    out = printed(capsys, ["summary", str(log_dir)])
    assert not forbidden(out)
    assert printable(f"stopped: {text}") in out and printable(f"rank 1 waits{text}") in out


@HOSTILE_SETTINGS
@given(text=hostile)
def test_failure_line_of_run_prints_hostile_reasons_inert(text, tmp_path, capsys):
    """`ringtop run`'s last line, printed as the command prints it (inside main's safe terminal)."""
    from ringtop.cli import training
    from ringtop.cli.terminal import safe_terminal

    log_dir = Path(tempfile.mkdtemp(dir=tmp_path))
    write_run_log(log_dir, text)
    with safe_terminal():
        training.report_failure(1, str(log_dir), "")
    out = capsys.readouterr().err
    assert "rank 0:" in out and not forbidden(out)


@HOSTILE_SETTINGS
@given(text=hostile)
def test_ls_and_connect_info_print_a_hostile_connection_file_inert(text, tmp_path, capsys, monkeypatch):
    runtime = Path(tempfile.mkdtemp(dir=tmp_path)) / "rt"
    write_connection_file(runtime, text)
    monkeypatch.setenv(RUNTIME_ENV, str(runtime))
    listing = printed(capsys, ["ls"])
    assert not forbidden(listing) and printable(f"runs/{text}") in listing
    info = printed(capsys, ["connect-info"])
    assert not forbidden(info)
    assert json.loads(info)["log_dir"] == f"runs/{text}"  # still the file's value, as JSON


@HOSTILE_SETTINGS
@given(text=hostile)
def test_replay_and_plan_print_hostile_arguments_inert(text, tmp_path, capsys):
    assert not forbidden(printed(capsys, ["replay", str(tmp_path / f"no/such{text}")]))
    assert not forbidden(printed(capsys, ["plan", "--params", "7e9", "--ranks", "8", "--link", f"x{text}"]))
    assert not forbidden(printed(capsys, ["plan", "--model", f"hf:{text}", "--ranks", "8"]))


@HOSTILE_SETTINGS
@given(text=hostile)
def test_ckpt_info_prints_a_hostile_meta_inert(text, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from ringtop.agent.checkpoints.format import FORMATS

    where = Path(tempfile.mkdtemp(dir=tmp_path)) / "step-00000003-full"
    where.mkdir()
    save_file({"w": torch.zeros(2)}, str(where / "model.safetensors"))
    meta = {"format": FORMATS["full"], "kind": "full", "step": 3, "model": f"m{text}", "strategy": f"ddp{text}",
            "run_id": text}
    (where / "meta.json").write_text(json.dumps(meta))
    out = printed(capsys, ["ckpt", "info", str(where)])
    assert not forbidden(out) and printable(f"m{text}") in out


class HostileControl:
    """A real ROUTER on a free port answering every command with `reply_for(command)`."""

    def __init__(self) -> None:
        self.address = f"tcp://127.0.0.1:{free_tcp_port()}"
        self.text = ""
        self.status = "done"
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HostileControl:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.address)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(50):
                    continue
                identity, payload = sock.recv_multipart()
                cmd = decode(payload)
                assert isinstance(cmd, Command)
                reply = Reply(rank=0, seq=1, ts=1.0, id=cmd.id, status=self.status, cmd=cmd.cmd,
                              result={f"path{self.text}": f"/ck/{self.text}"}, error=f"failed: {self.text}",
                              code="failed")
                sock.send_multipart([identity, encode(reply)])
        finally:
            sock.close()


@pytest.fixture(scope="module")
def hostile_control():
    with HostileControl() as server:
        yield server


@HOSTILE_SETTINGS
@given(text=hostile, status=st.sampled_from(["done", "error"]), as_json=st.booleans())
def test_ctl_prints_hostile_replies_inert(text, status, as_json, hostile_control, capsys):
    hostile_control.text, hostile_control.status = text, status
    argv = ["ctl", "--insecure", "--connect", hostile_control.address, "--timeout", "10", "checkpoint"]
    out = printed(capsys, argv + ["--json"] if as_json else argv)
    assert not forbidden(out)
    if as_json:
        assert json.loads(out.splitlines()[0])["error"] == f"failed: {text}"
    elif status == "error":
        assert printable(f"failed: {text}") in out


@pytest.mark.parametrize("guarded", [True, False], ids=["safe", "bites-without-the-guard"])
def test_the_checks_see_raw_escapes_when_the_guard_is_off(guarded, tmp_path, capsys, monkeypatch):
    """The same printers with the sanitizer made a no-op: the check above finds the escapes."""
    if not guarded:
        monkeypatch.setattr("ringtop.cli.terminal.printable", lambda text: text)
    write_run_log(tmp_path / "logs", PWNED)
    out = printed(capsys, ["summary", str(tmp_path / "logs")])
    write_connection_file(tmp_path / "rt", PWNED)
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path / "rt"))
    out += printed(capsys, ["ls"])
    assert bool(forbidden(out)) is not guarded


def cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ringtop.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def test_the_real_command_prints_a_hostile_stop_reason_inert(tmp_path):
    write_run_log(tmp_path / "logs", PWNED)
    proc = cli("summary", str(tmp_path / "logs"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert b"\x1b" not in out + err and b"\x07" not in out + err
    assert b"stopped: \\x1b]2;PWNED\\x07\\x1b[2J" in out


def test_a_closed_pipe_ends_a_command_quietly(tmp_path):
    """`ringtop plan ... | head -0`: the reader is gone before the first line; no traceback, exit 141."""
    proc = cli("plan", "--params", "7e9", "--ranks", "8")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err
