"""Commands from a client to every rank: the channel, what was done, stacks, profiles, allowed paths."""
