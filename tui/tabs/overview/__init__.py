"""The Overview: the health line, one row per rank (or per node at scale), charts, alerts."""
