"""The suites gate ships, one folder each with the same files (see docs/architecture.md, "Adding a suite").

    contract.py   the suite's vocabulary (tables, columns, defect types) and its contract's checks
    cases.py      its case format, checked strictly
    generator.py  its seeded case generator
    world.py      the prepared case and one episode's world (the loader, the mart)
    tools.py      its tools (what each takes, what a model is told) and its episode
    grader.py     its rubric (`kernel.grading.Rubric`) and the fold of its ledger
    rules.py      its contract's rules as data; schemas.py: the pandera schemas built from them
    gold.py       the dense reward's gold rows; findings.py: what its contract finds (the Dagster check)
    agents.py     its baselines; attackers.py: agents that try to score without doing the job
    prompt.py     the system prompt a model gets
    __init__.py   `SUITE`, the `kernel.suite.Suite` that holds all of it

The kernel finds them through the `gate.suites` entry points in `pyproject.toml`; no module
outside this folder names one.
"""
