"""Running the transformer's blocks in training: checkpointing and streaming frozen weights through a ring.

Import the modules themselves (`streaming.runner`, `streaming.placement`, ...): this file imports nothing, so
the planner can read the pure placement policy without torch's engine parts.
"""
