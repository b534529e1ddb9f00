"""The per-node watcher process, outside the ranks (process.py), and rank 0's link to it (link.py)."""
