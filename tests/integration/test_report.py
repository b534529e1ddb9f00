"""`ringtop report`: one recorded 2-rank gloo run, its page written by the real CLI. Fast checks
read the HTML (no network reference, every figure, the plots' numbers against the logs read here
and the table against `ringtop summary`'s own printout, hostile log text escaped); one renders the
page in headless Chromium and finds the plots' colours in the screenshot — and none once the
embedded plotly is taken out (the check bites)."""

from __future__ import annotations

import html
import json
import re
import shutil
import statistics
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from conftest import agent_env, finished_agents

from ringtop.cli.report import FIGURE_IDS, INSTALL_HINT, MANY_RANKS, RunLogs, script_json, step_time_section
from ringtop.cli.summary import goodput, goodput_line, print_summary
from ringtop.protocol import Event, Hello, Step, Timeline, read_log, to_json_line

pytestmark = pytest.mark.timeout(180)
pytest.importorskip("plotly", reason=INSTALL_HINT)

HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(1)><!--"


def cli_report(log_dir: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtop.cli", "report", str(log_dir), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=agent_env())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, finished_ddp_run) -> tuple[Path, Path]:
    """A finished 2-rank DDP run's logs (conftest.finished_ddp_run) and the page `ringtop report` wrote of them."""
    run = finished_ddp_run
    out = tmp_path_factory.mktemp("report") / "report.html"
    done = cli_report(run.log_dir, out)
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout
    return run.log_dir, out


def figures(page: str) -> dict[str, dict]:
    """Each plot's figure, by section id, parsed with json (not plotly) from its script block."""
    blocks = re.findall(r"<script type='application/json' class='figure' data-target='fig-([a-z-]+)'>(.*?)</script>",
                        page, flags=re.S)
    return {name: json.loads(text) for name, text in blocks}


def trace(fig: dict, name: str) -> dict:
    (found,) = [t for t in fig["data"] if t.get("name") == name]
    return found


def network_references(page: str) -> list[str]:
    """Every tag that would load something when the page opens (a script, a stylesheet, an image...)."""
    return re.findall(r"<(?:script|link|img|iframe|source|object|embed)\b[^>]*\b(?:src|href|data)\s*=[^>]*>", page,
                      flags=re.I) + re.findall(r"<link\b[^>]*>", page, flags=re.I)


def test_the_page_loads_nothing_from_the_network_and_embeds_plotly(recorded):
    page = recorded[1].read_text()
    assert network_references(page) == []
    bundle = re.search(r"<script id='plotly-js'>(.*?)</script>", page, flags=re.S)
    assert bundle is not None and len(bundle.group(1)) > 1_000_000 and "Plotly" in bundle.group(1)


def test_the_network_check_finds_plotlys_own_cdn_page():
    go = pytest.importorskip("plotly.graph_objects")
    cdn_page = go.Figure(go.Scatter(x=[1, 2], y=[3, 4])).to_html(include_plotlyjs="cdn")
    assert [ref for ref in network_references(cdn_page) if "https://" in ref]


def test_every_figure_is_drawn_from_the_logs(recorded):
    log_dir, out = recorded
    page = out.read_text()
    figs = figures(page)
    assert set(figs) == set(FIGURE_IDS) - {"pipeline"}  # a DDP run: no pipeline, said so instead
    assert "n/a: not a pipeline run" in page
    assert "MFU n/a: the device&#x27;s peak is not known" in page  # CPU: no peak, never a guessed one
    for rank in (0, 1):
        steps = [m for m in read_log(log_dir / f"rank-{rank}.jsonl") if isinstance(m, Step)]
        assert len(steps) == 6
        line = trace(figs["step-time"], f"rank {rank}")
        assert (line["x"], line["y"]) == ([s.step for s in steps], [s.step_ms for s in steps])
        assert trace(figs["loss"], f"loss rank {rank}")["y"] == [s.loss for s in steps]
        assert trace(figs["comm"], f"exposed rank {rank}")["y"] == [s.exposed_comm_ms for s in steps]
        assert trace(figs["throughput"], f"tokens/s rank {rank}")["y"] == [s.tokens_per_s for s in steps]
    steps = {r: [m for m in read_log(log_dir / f"rank-{r}.jsonl") if isinstance(m, Step)] for r in (0, 1)}
    for rank in (0, 1):  # where the step went: each rank's stacked parts add up to its mean step after the first
        stacked = sum(t["x"][rank] for t in figs["where"]["data"])
        assert stacked == pytest.approx(sum(s.step_ms for s in steps[rank][1:]) / 5, rel=1e-9)
    # busbw of all-reduce on 2 ranks: bytes over busy time (both ranks summed) x 2(n-1)/n = 1
    expected = [sum(c.bytes for r in (0, 1) for c in steps[r][i].comm) / 1e9
                / (sum(c.busy_ms for r in (0, 1) for c in steps[r][i].comm) / 1e3) for i in range(6)]
    assert trace(figs["comm"], "all_reduce")["y"] == pytest.approx(expected, rel=1e-9)
    # the longest step each step: the larger step time, its excess over the other's
    slow = trace(figs["step-time"], "longest step")
    for i in range(6):
        a, b = steps[0][i].step_ms, steps[1][i].step_ms
        assert slow["text"][i] == f"rank {1 if b >= a else 0}"
        assert slow["y"][i] == pytest.approx(100 * (max(a, b) / min(a, b) - 1), rel=1e-9)
    hello = next(m for m in read_log(log_dir / "rank-0.jsonl") if isinstance(m, Hello))
    measured = [t["y"] for t in figs["memory"]["data"] if t["name"] == "params"][0]
    unit = {"MiB": 1 << 20, "GiB": 1 << 30}[figs["memory"]["layout"]["yaxis"]["title"]["text"]]  # binary, as shown
    assert measured[0] == steps[0][-1].mem.params_bytes / unit
    assert measured[1] == hello.prediction.params_bytes / unit
    good = goodput(log_dir)
    bars = {t["name"]: t["x"][0] for t in figs["goodput"]["data"]}
    assert bars["productive"] == good.productive_s and sum(bars.values()) == pytest.approx(good.wall_s, rel=1e-9)
    assert html.escape(goodput_line(good)) in page
    assert f"<td>{hello.run_id}</td>" in page and "<td>formula 6N+12LHS</td>" in page  # the Hello's config


def test_the_rank_table_says_what_ringtop_summary_prints(recorded, capsys):
    log_dir, out = recorded
    print_summary(log_dir)
    printed = {int(line.split()[0]): " ".join(line.split())
               for line in capsys.readouterr().out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)}
    table = re.search(r"<table id='summary'>(.*?)</table>", out.read_text(), flags=re.S).group(1)
    rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    assert [int(r[0]) for r in rows] == sorted(printed) == [0, 1]
    for cells in rows:  # summary's row, its columns' spacing aside: rank steps first → last step-ms comm ...
        assert " ".join([*cells[:3], "→", *cells[3:]]) == printed[int(cells[0])]


def hostile_copy(log_dir: Path, into: Path) -> Path:
    """The run's logs with hostile text in rank 0's host and model and in an event of rank 1."""
    into.mkdir()
    for path in log_dir.glob("rank-*.jsonl"):
        messages = read_log(path)
        if path.name == "rank-0.jsonl":
            messages = [msgspec.structs.replace(m, host=HOSTILE, model=HOSTILE) if isinstance(m, Hello) else m
                        for m in messages]
        else:
            last = messages[-2]
            messages.insert(-1, Event(rank=1, ts=last.ts, level="warn", kind=HOSTILE, text=HOSTILE))
        (into / path.name).write_bytes(b"".join(to_json_line(m) for m in messages))
    return into


def test_hostile_log_text_is_shown_escaped_and_never_as_markup(recorded, tmp_path):
    logs = hostile_copy(recorded[0], tmp_path / "logs")
    out = tmp_path / "hostile.html"
    done = cli_report(logs, out)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    bundle_end = page.index("</script>", page.index("<script id='plotly-js'>")) + len("</script>")
    ours = page[bundle_end:]
    assert HOSTILE not in ours and "<img" not in ours and "alert(1)</script>" not in ours
    assert html.escape(HOSTILE) in ours  # in the events table, the config and the title
    assert ours.count("<script") == ours.count("</script>") == len(figures(page)) + 1
    events = figures(page)["events"]
    shown = [text for t in events["data"] for text in t.get("text", [])] + [y for t in events["data"] for y in t["y"]]
    assert any(html.escape(HOSTILE, quote=False) in text for text in shown)  # plotly shows entities as characters
    assert not any("<" in text for text in shown)  # no label plotly would read as markup (its <a href>, <b>)
    # the script blocks' own guard, on raw JSON that would close its block: nothing closes, the same value reads back
    raw = json.dumps({"text": HOSTILE, "line": "\u2028"}, ensure_ascii=False)
    assert "</script>" in raw and "</" not in script_json(raw) and "<!--" not in script_json(raw)
    assert json.loads(script_json(raw)) == json.loads(raw)


def test_a_log_dir_without_logs_is_one_line_and_exit_2(tmp_path):
    done = cli_report(tmp_path, tmp_path / "r.html")
    assert done.returncode == 2 and "no rank-R.jsonl files" in done.stderr
    assert not (tmp_path / "r.html").exists()


# ---------------------------------------------------------------- the page as a browser draws it

def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB(A) rows of an 8-bit non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            idat += body
    raw, bpp = zlib.decompress(idat), 3 if colour == 2 else 4
    stride, rows, prev = w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif f == 4:
            for i in range(stride):
                a, b, c = (line[i - bpp], prev[i], prev[i - bpp]) if i >= bpp else (0, prev[i], 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, bpp, rows


PLOT_COLOURS = {"rank 0": (0x1F, 0x77, 0xB4), "rank 1": (0xFF, 0x7F, 0x0E), "goodput, memory": (0x63, 0x6E, 0xFA)}
"""Rank 0's and rank 1's line colours, and plotly's first default colour (bars); none is in the page's own CSS."""


def colour_counts(png: bytes) -> dict[str, int]:
    """Pixels within a small distance of each plot colour (anti-aliased edges included)."""
    _, bpp, rows = png_pixels(png)
    seen: Counter = Counter()
    for row in rows:
        seen.update(zip(row[0::bpp], row[1::bpp], row[2::bpp]))
    return {name: sum(n for px, n in seen.items() if all(abs(px[i] - rgb[i]) <= 12 for i in range(3)))
            for name, rgb in PLOT_COLOURS.items()}


def screenshot(page: Path, png: Path) -> bytes:
    done = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={png.parent / 'chromium-profile'}",  # not a profile another may hold
                           f"--screenshot={png}", "--window-size=1400,4000", "--force-device-scale-factor=0.5",
                           "--virtual-time-budget=5000", page.as_uri()],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    return png.read_bytes()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium here (Debian: apt-get install chromium)")
def test_chromium_draws_the_plots_and_draws_none_without_the_embedded_plotly(recorded, tmp_path):
    page = recorded[1].read_text()
    drawn = colour_counts(screenshot(recorded[1], tmp_path / "report.png"))
    assert all(n > 200 for n in drawn.values()), drawn
    without_js = tmp_path / "no-js.html"
    without_js.write_text(re.sub(r"<script id='plotly-js'>.*?</script>", "", page, count=1, flags=re.S))
    blank = colour_counts(screenshot(without_js, tmp_path / "no-js.png"))
    assert blank == dict.fromkeys(PLOT_COLOURS, 0), blank


def test_a_pipeline_runs_bubble_is_plotted_against_the_formula(tmp_path):
    """A real 2-stage GPipe run of 4 micro-batches: each stage's measured bubble as its Timeline
    says, beside (N-1)/(N+M-1) = 1/5 worked out here."""
    run = finished_agents(tmp_path / "run", 2, "--strategy", "pp", "--pp-stages", "2", "--micro-batches", "4",
                          "--steps", "3", "--batch-size", "4", "--seq-len", "32", timeout_s=150)
    done = cli_report(run.log_dir, tmp_path / "pp.html")
    assert done.returncode == 0, done.stderr
    fig = figures((tmp_path / "pp.html").read_text())["pipeline"]
    for stage in (0, 1):
        timelines = [m for m in read_log(run.log_dir / f"rank-{stage}.jsonl") if isinstance(m, Timeline)]
        assert timelines and all(t.stage == stage for t in timelines)
        measured = trace(fig, f"stage {stage} measured")
        assert (measured["x"], measured["y"]) == ([t.step for t in timelines], [100 * t.bubble for t in timelines])
    (theory,) = [t for t in fig["data"] if t["name"].startswith("theory")]
    assert theory["y"] and all(y == pytest.approx(100 * (2 - 1) / (2 + 4 - 1)) for y in theory["y"])


def test_without_plotly_it_says_how_to_install_it(recorded, tmp_path):
    blocked = ("import sys; sys.modules['plotly'] = None; from ringtop.cli.main import main; "
               "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", blocked, "report", str(recorded[0]), "-o", str(tmp_path / "r.html")],
                          capture_output=True, text=True, timeout=60, env=agent_env())
    assert done.returncode == 2 and INSTALL_HINT in done.stderr and "[report]" in done.stderr
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("ranks", [MANY_RANKS, MANY_RANKS + 1])
def test_past_many_ranks_a_plot_draws_the_spread_over_ranks_not_a_line_each(ranks):
    """Step times made up here (rank r, step k: 100 + 7r + k ms, rank 3 slow at step 2): up to
    MANY_RANKS a line per rank; past it the median, fewest and most per step worked out here."""
    logs = RunLogs(Path("."))
    for r in range(ranks):
        logs.steps[r] = [Step(rank=r, step=k, loss=1.0, step_ms=100 + 7 * r + k + (500 if (r, k) == (3, 2) else 0))
                         for k in (1, 2, 3)]
    fig = json.loads(step_time_section(logs).figure.to_json())
    names = [t["name"] for t in fig["data"]]
    times = {k: [100 + 7 * r + k + (500 if (r, k) == (3, 2) else 0) for r in range(ranks)] for k in (1, 2, 3)}
    if ranks <= MANY_RANKS:
        assert names == [f"rank {r}" for r in range(ranks)] + ["longest step"]
        return
    assert "rank 0" not in names and len(fig["data"]) == 4
    assert trace(fig, "median over ranks")["y"] == [statistics.median(times[k]) for k in (1, 2, 3)]
    assert trace(fig, "fewest to most over ranks")["y"] == [min(times[k]) for k in (1, 2, 3)]
    assert trace(fig, "most of any rank")["y"] == [max(times[k]) for k in (1, 2, 3)]
    assert trace(fig, "longest step")["text"] == [f"rank {ranks - 1}", "rank 3", f"rank {ranks - 1}"]
