"""Renders docs/screenshot.svg: the real UI on a real 2-rank CPU run (as `ringtop demo` shows it)."""

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from ringtop.cli.launch import start_ranks, stop_ranks
from ringtop.protocol import connection_file, free_tcp_port
from ringtop.tui.app import RingtopApp

OUT = Path(__file__).resolve().parents[1] / "docs" / "screenshot.svg"


async def main(steps_to_wait: int = 40, size: tuple[int, int] = (140, 36)) -> None:
    publish, relay, control = (f"tcp://127.0.0.1:{free_tcp_port()}" for _ in range(3))
    run_id = f"shot{int(time.time()) % 100000}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_ranks(2, ["--steps", "0", "--publish", publish, "--relay", relay, "--control", control,
                               "--log-dir", tmp, "--checkpoint-dir", f"{tmp}/ckpt", "--run-id", run_id],
                           output_file=Path(tmp) / "out")
        try:
            path = connection_file.file_for(run_id)  # the run's keys: the UI attaches as `ringtop ui` does
            deadline = time.monotonic() + 120
            while not path.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the run did not start:\n{(Path(tmp) / 'out').read_text()[-3000:]}")
                await asyncio.sleep(0.2)
            keys = connection_file.read(path).keys
            app = RingtopApp(publish_addr=publish, control_addr=control, keys=keys)
            async with app.run_test(size=size) as pilot:
                deadline = time.monotonic() + 180
                while app.view.latest_step < steps_to_wait and time.monotonic() < deadline:
                    await pilot.pause(0.5)
                await pilot.press("c")
                await pilot.pause(3)
                app.save_screenshot(str(OUT.name), str(OUT.parent))
        finally:
            stop_ranks(proc)
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
