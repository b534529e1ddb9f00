"""ringtop's terminal UI (Textual). Imports only the stdlib, textual, rich, pyzmq, msgspec,
`ringtop.protocol` and the torch-free cost model (`ringtop.strategies.cost_model`, `.links`) —
never torch, so it starts on a laptop or login node without it.

- `view_model`: `RunView`, the pure aggregation of protocol messages the screens render
- `connection`: `TelemetryClient`, the thread owning the SUB (telemetry) and DEALER (control) sockets
- `replay`: `load_replay`, reading a `rank-R.jsonl` log directory
- `memory`: the Memory tab's figures (measured vs predicted state, which strategy would fit), pure
- `memory_tab`: their rendering as Rich text and table cells
- `tables`: `SyncedTable`, keeping a DataTable equal to a list of rows by updating changed cells
- `app`: `RingtopApp`, `run_live`, `run_replay`
"""
