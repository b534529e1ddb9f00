"""ringtop's terminal UI (Textual). Imports only the stdlib, textual, rich, pyzmq, msgspec and
`ringtop.protocol` — never torch, so it starts on a laptop or login node without it.

- `view_model`: `RunView`, the pure aggregation of protocol messages the screens render
- `connection`: `TelemetryClient`, the thread owning the SUB (telemetry) and DEALER (control) sockets
- `replay`: `load_replay`, reading a `rank-R.jsonl` log directory
- `app`: `RingtopApp`, `run_live`, `run_replay`
"""
