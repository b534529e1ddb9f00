"""Whether a rank is well: stalls, hangs, gone peers, non-finite steps, the diagnosis exchange."""
