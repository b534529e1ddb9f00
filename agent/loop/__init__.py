"""The training loop a rank runs: ringtop's own (the runner), a user's under `ringtop.Monitor`, live switches."""
