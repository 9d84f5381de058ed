"""Several suites' plans at once on one GPU: the rows they carry, their predicted time, the device calls.

scripts/gpu-science.sh runs a few suites' plans side by side, each through its own local workers, all packed on
one GPU. This prints each plan (costs.plan_lines: its jobs, each predicted alone on the GPU, and the claims' rows
they carry, headline or not), then from start to end with every plan's jobs on the GPU together
(DeviceTimes.walls: one number where the doctor measured packing, else a range) and what that assumes, then the
deadline a device call gets and how many calls the plans need. A device call runs at most PER_CALL seconds:
the deadline leaves STOPPING for the runs to checkpoint and stop and SET_UP for the call to start, and a call
after the first resumes its runs from their checkpoints, paying each one's start-up and compile warm-up again.

    scripts/side_by_side.py --predict-on DOCTOR_JSON --out FOLDER "SUITE WORKERS [--only ...] [--arms ...]
        [--seeds N]" ...

The lab imports no paper: the script hands main the papers' get_suite.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..arguments import Parser, check_folder, positive_int, seed_count
from ..errors import UserError
from .carried import carried_rows, headline_line, recorded
from .costs import plan_lines, prediction_lines
from .device_times import DeviceTimes

PER_CALL = 600  # seconds one command on a lent device machine may run
STOPPING = 60  # seconds the script leaves its runs past the deadline to checkpoint and stop (timeout --kill-after)
SET_UP = 60  # seconds a call spends before the plans start: the wheels installed aside, Python and CUDA started
MOST = PER_CALL - STOPPING - SET_UP  # the longest deadline a call can give
MARGIN = 1.25  # the deadline over the prediction it is sized from: the prediction's own error is not known


class PlanParser(Parser):
    """A plan's words, whose mistakes are one line naming the plan and the form a plan takes."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message}; a plan is SUITE WORKERS [--only ...] [--arms ...] [--seeds N]")


@dataclass(frozen=True)
class Side:
    """One suite's plan: its workers (its runs at once on the GPU) and the reproduce options that select it."""

    suite: str
    workers: int
    only: tuple[str, ...] = ()
    arms: tuple[str, ...] = ()
    seeds: int | None = None

    @classmethod
    def parse(cls, text: str) -> Side:
        """ "SUITE WORKERS [--only ...] [--arms ...] [--seeds N]", or one line naming what is wrong."""
        words = shlex.split(text)
        parser = PlanParser(prog=f"plan {text!r}", add_help=False)
        parser.add_argument("suite")
        parser.add_argument("workers", type=positive_int)
        parser.add_argument("--only", nargs="+", default=())
        parser.add_argument("--arms", nargs="+", default=())
        parser.add_argument("--seeds", type=seed_count)
        args = parser.parse_args(words)
        return cls(args.suite, args.workers, tuple(args.only), tuple(args.arms), args.seeds)


def deadline(longest: float) -> int:
    """A call's deadline in seconds: the longest prediction with MARGIN, at most MOST."""
    return min(MOST, math.ceil(longest * MARGIN))


def device_calls(wall: float, limit: float, again: float) -> int:
    """Calls of `limit` seconds each that `wall` seconds of plan take, where every call after the first pays
    `again` seconds before its runs reach the step they stopped at."""
    if wall <= limit:
        return 1
    return 1 + math.ceil((wall - limit) / max(1.0, limit - again))


def plan_side(side: Side, suite, out: Path, device: DeviceTimes) -> tuple[list[str], list[float], str]:
    """One suite's plan: its lines, its jobs' seconds alone on the GPU, and its headline line."""
    from .driver import dry_run  # the driver brings torch: an argument's mistake is said before it loads

    folder = out / f"{side.suite}-{suite.tier}"
    plan = dry_run(suite, folder, seeds=side.seeds, only=side.only, arms=side.arms)
    results = recorded(folder)
    lines, costs = plan_lines(suite, plan, device, results)
    return lines, costs, headline_line(suite, [claim for claim, _, _ in carried_rows(suite, plan, results)])


def describe(sides: list[tuple[Side, object]], out: Path, device: DeviceTimes, given: int | None = None) -> list[str]:
    """Every plan (a Side and its suite), then all of them side by side: from start to end, the headline rows
    carried, the deadline (`given`, or sized from the prediction) and the device calls."""
    lines, groups, headlines = [], [], []
    for side, suite in sides:
        side_lines, costs, headline = plan_side(side, suite, out, device)
        lines += side_lines
        groups.append((costs, side.workers))
        headlines.append(headline)
    low, high = device.walls(groups)
    workers = ", ".join(f"{side.suite} {side.workers}" for side, _ in sides)
    lines += prediction_lines(device, low, high, f"side by side on one {device.device} (workers: {workers}; "
                              f"{sum(side.workers for side, _ in sides)} runs at once at most)")
    return lines + headlines + [calls_line(device, low, high, given)]


def calls_line(device: DeviceTimes, low: float, high: float, given: int | None = None) -> str:
    """The deadline a call gives the plans (`given`, or sized from the most the prediction says) and the device
    calls they need (a range where packing was not measured)."""
    limit = given or deadline(high)
    sized = "given" if given else f"the prediction x {MARGIN:g}, at most {MOST} s"
    again = device.start_up + device.compile_warmup
    calls = sorted({device_calls(wall, limit, again) for wall in (low, high)})
    ranged = (" (packing unmeasured: every run at its speed alone to their steps one after another)"
              if len(calls) > 1 else "")
    resumed = ("; each call after the first resumes its runs, paying their start-up and compile warm-up again"
               if calls[-1] > 1 else "")
    return (f"deadline: {limit} s a call ({sized}: a call runs at most {PER_CALL} s, less {STOPPING} s to stop and "
            f"{SET_UP} s to start); device calls needed: {' to '.join(map(str, calls))}{ranged}{resumed}")


def main(argv: list[str], suite_of: Callable) -> int:
    """The plans side by side, printed, their suites from suite_of(name, tier); exit code 2 and one line where an
    argument is wrong."""
    parser = Parser(prog="scripts/side_by_side.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="+", metavar="PLAN", help="SUITE WORKERS [--only ...] [--arms ...] [--seeds N]")
    parser.add_argument("--predict-on", required=True, metavar="DOCTOR_JSON", help="a GPU's doctor.json")
    parser.add_argument("--out", required=True, help="the folder whose <suite>-<tier>/ the plans continue")
    parser.add_argument("--tier", default="converged")
    parser.add_argument("--deadline", type=positive_int, help="seconds a call gives the plans (default: sized)")
    try:
        args = parser.parse_args(argv)
        check_folder(args.out, "--out")
        sides = [(side, suite_of(side.suite, args.tier)) for side in map(Side.parse, args.plans)]
        print("\n".join(describe(sides, Path(args.out), DeviceTimes.load(args.predict_on), args.deadline)))
    except (UserError, OSError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0
