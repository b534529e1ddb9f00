"""The maths the agent, the UI and the planner share, each figure defined once: compute time,
algbw/busbw, the slowest-rank rule, loss spikes, strategy names and labels, number formats.

Stdlib only — never torch, textual or rich: the agent, `ringtop plan` on a laptop and the UI all
import it.
"""
