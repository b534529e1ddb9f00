"""The one-line header: the run's facts, operations in flight, the connection state."""
