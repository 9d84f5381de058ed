"""attnlab doctor: every mixer on this machine's GPU against fp64, its timings, fla, and a short training."""

from __future__ import annotations

from ..arguments import check_folder, non_negative_int


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="every mixer on this machine's GPU against fp64, timings, fla, a short training")
    p.add_argument("--out", default="runs/doctor", help="folder for doctor.json")
    p.add_argument("--train-steps", type=non_negative_int, default=200,
                   help="steps of the demo model (0: no training)")
    p.add_argument("--dry-run", action="store_true",
                   help="the GPU run's timed sections too, at tiny sizes and unjudged, on whatever device is here")
    p.set_defaults(func=main, check=lambda args: check_folder(args.out, "--out"))


def main(args) -> None:
    from ..lab.doctor import run_doctor

    run_doctor(args.out, args.train_steps, args.dry_run)
