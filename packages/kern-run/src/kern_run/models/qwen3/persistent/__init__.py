"""The Qwen3 decode step as a persistent kernel's instruction table (docs/persistent.md): the record layout and its
checked packing (isa.py), the builder of the table and its queues (schedule.py), and the simulator that proves a
table runs to completion and keeps the sequential program's data-flow (simulate.py)."""
