"""`gate replay`: recorded tool calls applied to fresh episodes, and graded."""
from __future__ import annotations

import json

from ..kernel.files import read_text
from ..kernel.settings import Settings
from .common import CASES_HELP, cases_arg
from .errors import UsageError
from .report import REWARD_CHOICES

MAX_TRAJECTORY_BYTES = 2**30  # a trajectory file is read whole: at most this


def cmd_replay(a, settings: Settings) -> int:
    from ..kernel.actions import parse_trajectories
    from ..kernel.engine import replay
    from ..kernel.pool import CasePool
    path = cases_arg(a, settings)
    pool = CasePool.from_file(path)
    text = read_text(a.trajectories, "trajectory file", MAX_TRAJECTORY_BYTES, UsageError)
    items = parse_trajectories(text, a.trajectories, pool, str(path))
    if not items:
        raise UsageError(f"{a.trajectories}: no trajectories in the file (one JSON object per line: "
                         f"{{\"case_id\": ..., \"calls\": [...]}})")
    for case_id, actions in items:
        results, episode = replay(pool.prepared(case_id), actions, reward=a.reward)
        g = episode.grade
        if a.json:
            out = {"case_id": case_id, "results": results, "ledger": episode.ledger, "grade": g.as_dict(),
                   "revenue": g.revenue}
            if a.reward != "terminal":
                out["rewards"] = episode.rewards
                out[f"{a.reward}_return"] = episode.total_reward
            print(json.dumps(out))
        else:
            print(f"{case_id:<28} reward {g.reward:.4f}  calls {len(results)}  "
                  f"ledger {'intact' if g.ledger_intact else 'BROKEN'}")
    return 0


def register(subparsers) -> None:
    rp = subparsers.add_parser("replay", help="apply recorded tool calls to fresh episodes",
                               description="Replay trajectories (JSON lines: {\"case_id\": ..., \"calls\": [{\"tool\": ...,"
                                           " \"args\": {...}}, ...]}; docs/task.md) and grade them.",
                               epilog="example:\n  gate replay --trajectories my_trajectories.jsonl --reward dense --json")
    rp.add_argument("--cases", default=None, help=CASES_HELP)
    rp.add_argument("--trajectories", required=True, metavar="FILE", help="the trajectories file (JSON lines)")
    rp.add_argument("--json", action="store_true", help="print each episode's results, ledger and grade as JSON")
    rp.add_argument("--reward", choices=REWARD_CHOICES, default="terminal",
                    help="add each call's reward under this mode and their sum (default: terminal)")
    rp.set_defaults(fn=cmd_replay)
