"""Parallel strategies behind one interface (torch). Their torch-free cost models live in metrics/costs/."""
