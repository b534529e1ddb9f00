"""The Hang view (and the Overview's hang banner): who holds the others up, per rank, stacks."""
