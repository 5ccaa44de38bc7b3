"""gate as a Dagster project: a partition per case, an op-level tool bridge, grading sensors.

One file per concern; `definitions.py` is the single entry point. The core never imports
this package.
"""
