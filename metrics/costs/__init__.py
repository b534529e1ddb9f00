"""Analytic costs, torch-free: memory, bytes, time and bubbles of each strategy and mesh; links; FLOPs."""
