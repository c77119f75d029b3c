"""The read/pack pipeline: materialises the pure plan from the table.

Resolving a spec against the table (planner, plan inputs, the plan store), reading rows (take,
fetch spans, read-ahead), packing groups on threads or worker processes, shared-memory slots, and
the torch ``IterableDataset``. Imports the plan and observe floors, never the other way round.
"""
