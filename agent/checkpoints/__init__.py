"""Full and sharded checkpoints: the format on disk and saving from a running job."""
