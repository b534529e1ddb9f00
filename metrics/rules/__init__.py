"""Rules that turn readings into words, torch-free: verdicts, advice, liveness, hangs, outliers."""
