"""The pure epoch plan: which token of which row lands where, from stored counts alone.

Numpy arrays in, numpy arrays out: nothing here reads the table, maps a file, holds shared
memory or imports Lance or torch (checked by ``tests/loader/test_layering.py``). The spec, the
visiting orders, the packing recipes, the step layout and the resume state live here.
"""
