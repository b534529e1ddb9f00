"""Per-rank measurements. Nothing here synchronises the device on the training thread."""
