"""The Pipeline tab: the stage timeline of the latest step, its bubble against theory, the history."""
