"""Observation of the loader: counters, queue gauges, the bottleneck verdict, the ledger.

What a run delivered and where its time went, from counts the pipeline hands over; nothing here
reads the table or holds shared memory (checked by ``tests/loader/test_layering.py``).
"""
