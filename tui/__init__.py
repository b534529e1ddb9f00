"""ringtop's terminal UI (Textual). Imports only the stdlib, textual, rich, pyzmq, msgspec,
`ringtop.protocol` and `ringtop.metrics` — never torch, so it starts on a laptop or login node
without it.

- `state/`: `RunView`, the one fold of protocol messages into the run's state the tabs render
- `sources/`: where messages come from — `TelemetryClient` (the SUB and DEALER sockets' thread),
  `load_replay` (a `rank-R.jsonl` log directory), the exit probe
- `tabs/<tab>/`: each tab's figures, at-scale view, rendering, model, widget and panel
- `header/`: the one-line header; `large_run/`: the tables of a large run (where, keys)
- `widgets/`: widgets the tabs share (drawing, fast table, sparkline)
- the shell: `app` (`RingtopApp`, `run_live`, `run_replay`), `screens`, `palette`, `keys_help`,
  `confirm`, `actions`, `run_commands`, `words`, `styles`, `deltas`, `tables`, `sanitize`, `stacks_text`
"""
