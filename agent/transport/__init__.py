"""Getting telemetry off a rank and to every UI: the publisher, the head and node relays, who gets in."""
