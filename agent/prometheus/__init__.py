"""Rank 0's Prometheus endpoint: the series' names, the exporter, its bounded HTTP server."""
