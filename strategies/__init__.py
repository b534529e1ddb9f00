"""Parallel strategies behind one interface. `base` and `registry` import torch; cost models will not."""
