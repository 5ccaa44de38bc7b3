"""The yardstick for bench_launch.py: one asset with one op that returns a number."""
import dagster as dg


@dg.asset
def trivial() -> int:
    return 1


defs = dg.Definitions(assets=[trivial])
