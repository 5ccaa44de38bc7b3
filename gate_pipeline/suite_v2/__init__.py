"""Suite v2: the bad batches the classic suite does not measure.

A v2 case starts from a warehouse with a past (earlier nights of clean loads and their load
log); its batches arrive as CSV files whose header may drift; the contract (contracts/v2.yaml)
adds history rules, a row-quarantine policy and a contract owner to ask. The modules here are
the suite's own parts (files, cases, generator, world, tools, grader, schemas, gold); the one
engine (`gate_pipeline.engine`) plays v2 episodes as it plays classic ones, through
`gate_pipeline.suites`.
"""
