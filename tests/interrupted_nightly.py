"""A nightly run that is interrupted part way, for the re-execution-from-failure test.

`python tests/interrupted_nightly.py CASES_FILE MARKER` runs the nightly job on the Dagster
instance in DAGSTER_HOME with the agents naive and `interrupted_nightly:StallOnce`, in chunks
of 4 cases. StallOnce plays as careful does, except that its STALL_AT-th episode, while MARKER
does not exist, writes MARKER and sleeps: the test then interrupts the run (SIGINT, as Ctrl-C),
so one chunk fails and the chunks after it never start. `... --reexecute RUN_ID` re-executes that
run from failure. The code location lists StallOnce only when GATE_AGENTS names it (the test sets
it), as a deployment lists its own agents.
"""
import sys
import time
from pathlib import Path

from gate_pipeline.kernel.agents import make_agent

AGENT = "interrupted_nightly:StallOnce"
STALL_AT = 6  # in the second chunk of 4 cases


class StallOnce:
    played = 0

    def __init__(self, marker: str):
        self.marker = Path(marker)
        self.careful = make_agent("careful")

    def play(self, tools, case=None):
        StallOnce.played += 1
        if StallOnce.played == STALL_AT and not self.marker.exists():
            self.marker.write_text("stalled")
            time.sleep(600)
        return self.careful.play(tools, case)


def nightly_job():  # Dagster is imported here only: `gate nightly` imports this agent before it loads Dagster
    from gate_pipeline.dagster_defs.definitions import defs
    return defs.resolve_job_def("nightly_benchmark")


def run_config(cases_file: str, marker: str) -> dict:
    from gate_pipeline.dagster_defs.jobs import nightly_run_config
    return nightly_run_config(cases_file, ["naive", AGENT], {AGENT: {"marker": marker}}, chunk_size=4)


if __name__ == "__main__":
    import dagster as dg
    with dg.DagsterInstance.get() as instance:
        if sys.argv[1] == "--reexecute":
            options = dg.ReexecutionOptions.from_failure(sys.argv[2], instance)
            with dg.execute_job(dg.reconstructable(nightly_job), instance, reexecution_options=options) as result:
                print(result.run_id, result.success, flush=True)
        else:
            cases_file, marker = sys.argv[1], sys.argv[2]
            result = dg.execute_job(dg.reconstructable(nightly_job), instance,
                                    run_config=run_config(cases_file, marker))
            print(result.run_id, result.success, flush=True)
