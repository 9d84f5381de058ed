"""The ``attnlab`` command: train | eval | generate | list | couplings | demo | reproduce | report | results |
bench."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from .errors import UserError


def cmd_train(args) -> None:
    from .config import load_config
    from .train import train

    cfg = load_config(args.config, args.overrides)
    summary = train(cfg, resume=args.resume, progress=not args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 speaks for all
        print(f"done: val loss {summary['val_loss']:.4f}, perplexity {summary['val_ppl']:.2f}, "
              f"checkpoints in {summary['run_dir']}")


def cmd_eval(args) -> None:
    from . import evaluate
    from .inference import load_run

    run = load_run(args.checkpoint)
    t = run.config.train
    if args.task is None:
        loss = evaluate.split_loss(run.model, run.corpus(), args.split, args.batches, t.batch_size // t.grad_accum,
                                   args.seq_len or t.seq_len, run.device)
        print(f"{run.folder}: {args.split} loss {loss:.4f} nats/token, perplexity {evaluate.perplexity(loss):.2f}")
    elif args.task in ("mqar", "brackets"):
        if run.config.data.source != args.task:
            raise UserError(f"{run.folder} was trained on data.source={run.config.data.source}, not {args.task}")
        for name, value in evaluate.task_accuracy(run.model, run.corpus(), run.device).items():
            print(f"{args.task} test {name}: {100 * value:.2f}%")
    elif args.task == "niah":
        from .data import niah

        lengths = [int(n) for n in (args.lengths or [t.seq_len, 2 * t.seq_len])]
        data = run.corpus() if run.config.data.source == "niah" else None
        haystack = data.haystacks["val"] if data else _heldout_text(run)
        results = niah.accuracy_by_length(run.model, run.tokenizer.encode, haystack, args.kind, lengths, args.samples,
                                          niah.NIAHConfig().depths, run.device)
        for length, by_depth in results.items():
            cells = "  ".join(f"{d:.2f}: {100 * a:5.1f}%" for d, a in by_depth.items())
            print(f"S-NIAH {args.kind} at {length} tokens, accuracy by depth  {cells}")
    else:  # extrapolation
        lengths = [int(n) for n in (args.lengths or [t.seq_len * f for f in (1, 2, 3.5, 5)])]
        curve = evaluate.perplexity_by_length(run.model, run.corpus(), lengths, device=run.device)
        for length, ppl in curve.items():
            print(f"context {length:>6} ({length / t.seq_len:.1f}x training): perplexity {ppl:.3f}")
        path = Path(args.out or run.folder.parent) / "extrapolation.png"
        evaluate.plot_perplexity_by_length({run.config.model.mixer: curve}, path, t.seq_len)
        print(f"figure: {path}")


def _heldout_text(run) -> str:
    """The validation text of the run's corpus, as the haystack for needle-in-a-haystack prompts."""
    corpus = run.corpus()
    return corpus.tokenizer.decode(corpus.split("val"))


def cmd_generate(args) -> None:
    from .inference import load_run

    run = load_run(args.checkpoint)
    context = -1 if args.context is None else (args.context or None)
    print(run.complete(args.prompt, args.tokens, args.temperature, args.top_k, args.seed, context))


def cmd_list(args) -> None:
    from .config import list_presets, load_config
    from .mixers import list_mixers, mixer_fields

    if not args.params:
        print("mixers:")
        for name in list_mixers():
            print(f"  {name:<22} fields: {', '.join(mixer_fields(name))}")
        print("presets:", ", ".join(list_presets()))
        return
    import torch

    from .model import Decoder

    cfg = load_config(args.config, args.overrides)
    cfg.model.vocab_size = cfg.model.vocab_size or 256
    print(f"{args.config or 'default'} model, vocab {cfg.model.vocab_size}, state at T={cfg.train.seq_len}:")
    print(f"  {'mixer':<22} {'parameters':>12} {'vs softmax':>11} {'state numbers':>14}")
    baseline = None
    for name in ["softmax"] + [m for m in list_mixers() if m != "softmax"]:
        cfg.model.mixer, cfg.model.layers = name, None
        try:
            with torch.device("meta"):  # shapes only: counting needs no memory or initialisation
                model = Decoder(cfg.model)
        except UserError as err:
            print(f"  {name:<22} (not buildable with this config: {err})")
            continue
        n = model.num_params()
        baseline = baseline or n
        print(f"  {name:<22} {n:>12,} {100 * (n / baseline - 1):>+10.3f}% {model.state_size(cfg.train.seq_len):>14,}")


def cmd_couplings(args) -> None:
    from .inference import load_run
    from .plots import coupling_profile, plot_couplings

    run = load_run(args.checkpoint)
    found = False
    for i, block in enumerate(run.model.blocks):
        if block.mixer.name != "boltzmann" or block.mixer.J is None:
            continue
        found = True
        J = block.mixer.coupling_matrix(block.mixer.cfg.window)
        mean, std = coupling_profile(J)
        print(f"layer {i}: mean J by distance |j - k| (+- std over pairs and heads)")
        for d, (m, s) in enumerate(zip(mean.tolist(), std.tolist(), strict=True), start=1):
            print(f"  {d:>3}  {m:+.4f} +- {s:.4f}")
        path = Path(args.out or run.folder.parent) / f"couplings-layer{i}.png"
        print(f"  figure: {plot_couplings(J, path, title=f'learned J, layer {i}')}")
    if not found:
        raise UserError(f"{run.folder} has no Boltzmann layer with couplings J")


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(out_dir=args.out, quick=args.quick)


def cmd_reproduce(args) -> None:
    from fnmatch import fnmatch

    from .experiments import PAPERS, get_suite
    from .experiments.report import write_report
    from .experiments.runner import run_suite

    if (args.seeds is not None and args.seeds < 1) or args.scale <= 0:
        raise UserError(f"--seeds {args.seeds} --scale {args.scale}: need at least one seed and a positive scale")
    names = [n for n in PAPERS if args.tier in PAPERS[n].TIERS] if args.suite == "all" else [args.suite]
    if not names:
        raise UserError(f"no suite has a tier '{args.tier}'; see attnlab reproduce --help")
    suites = {name: get_suite(name, args.tier) for name in names}  # every name and tier checked before any run
    if args.only and not any(fnmatch(e.name, p) for s in suites.values() for e in s.experiments for p in args.only):
        raise UserError(f"--only {' '.join(args.only)} matches no experiment of {', '.join(names)}")
    for name, suite in suites.items():
        if suite.gpu or args.estimate:
            from .experiments.gpu import describe_estimate

            print(f"{name} ({args.tier}): {describe_estimate(suite, seeds=args.seeds)}")
        if args.estimate:
            continue
        if args.only and not any(fnmatch(e.name, p) for e in suite.experiments for p in args.only):
            continue  # (all) this suite has none of the experiments asked for
        # smoke and rescaled runs get folders of their own: they never mix with, or overwrite, real results
        variant = "-quick" if args.quick else (f"-scale{args.scale:g}" if args.scale != 1 else "")
        out = Path(args.out) / f"{name}{'' if args.tier == 'default' else '-' + args.tier}{variant}"
        results = run_suite(suite, out, seeds=args.seeds, quick=args.quick, scale=args.scale, only=args.only or ())
        print(f"report: {write_report(suite, results, out)}")


def cmd_report(args) -> None:
    from .experiments import get_suite
    from .experiments.report import write_report
    from .experiments.runner import load_results

    path = Path(args.folder) / "results.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist; give a folder that attnlab reproduce wrote (results/<suite>)")
    results = load_results(path)
    print(f"report: {write_report(get_suite(results['suite'], results.get('tier', 'default')), results, args.folder)}")


def cmd_results(args) -> None:
    from .experiments.report import results_summary, update_readme

    summary = results_summary(args.root)
    if not summary:
        raise UserError(f"{args.root} holds no suite results (<suite>/results.json); run attnlab reproduce first")
    if args.readme:
        update_readme(args.readme, summary)
        print(f"updated the results section of {args.readme}")
    else:
        print(summary)


def cmd_bench(args) -> None:
    from . import bench

    if args.boltzmann:
        bench.bench_boltzmann()
    elif args.interdomain:
        bench.bench_interdomain()
    elif args.ops:
        bench.bench_ops(seq_len=(args.lengths or [4096])[-1], repeats=args.repeats or 3)
    elif args.model:
        bench.bench_training_step(args.model, args.mixers, repeats=args.repeats or 10)
    elif args.lengths:
        bench.bench_mixers(lengths=args.lengths, batch=args.batch, repeats=args.repeats or 3)
    else:
        bench.run_bench("quick" if args.quick else "default", args.out)


def cmd_doctor(args) -> None:
    from .doctor import run_doctor

    if args.train_steps < 0:
        raise UserError(f"--train-steps={args.train_steps} must be 0 (no training) or more")
    run_doctor(args.out, args.train_steps)


def build_parser() -> argparse.ArgumentParser:
    from .experiments import PAPERS

    parser = argparse.ArgumentParser(prog="attnlab", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for user errors too")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a preset or YAML file plus dotted overrides")
    p.add_argument("config", nargs="?", help="preset name (attnlab list) or path to a YAML file")
    p.add_argument("overrides", nargs="*", help="section.field=value, e.g. model.mixer=sigmoid train.steps=500")
    p.add_argument("--resume", help="'auto' (newest intact checkpoint of the run) or a checkpoint folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="loss and perplexity of a checkpoint on its corpus")
    p.add_argument("checkpoint", help="a run folder (its newest checkpoint) or a step-XXXXXXXX folder")
    p.add_argument("--split", default="val", choices=["train", "val"])
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--seq-len", type=int, default=None, help="context length (default: the training one)")
    p.add_argument("--task", choices=["mqar", "brackets", "niah", "extrapolation"],
                   help="task accuracy, needle-in-a-haystack retrieval, or perplexity against context length")
    p.add_argument("--kind", default="passkey", choices=["passkey", "number", "uuid"], help="--task niah")
    p.add_argument("--samples", type=int, default=10, help="--task niah: prompts per depth")
    p.add_argument("--lengths", type=float, nargs="+", help="--task niah/extrapolation: context lengths")
    p.add_argument("--out", help="--task extrapolation: folder for the figure (default: the run folder)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("generate", help="sample text from a checkpoint")
    p.add_argument("checkpoint", help="a run folder (its newest checkpoint) or a step-XXXXXXXX folder")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=None,
                   help="most tokens the model sees at once (default: its training length; 0: unbounded)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("list", help="registered mixers and presets; --params compares parameter counts")
    p.add_argument("--params", action="store_true", help="parameters and state of every mixer on a model")
    p.add_argument("config", nargs="?", help="preset or YAML file for --params (default: the default model)")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("couplings", help="a Boltzmann model's learned J: profile over distance and heat map")
    p.add_argument("checkpoint", help="a run folder (its newest checkpoint) or a step-XXXXXXXX folder")
    p.add_argument("--out", help="folder for the PNG files (default: the run folder)")
    p.set_defaults(func=cmd_couplings)

    p = sub.add_parser("demo", help="every mechanism on a language-modelling and a retrieval task (CPU, minutes)")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--quick", action="store_true", help="a few steps per model: a smoke test")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("reproduce", help="a paper's claims in miniature over seeds, with a report")
    p.add_argument("suite", choices=[*PAPERS, "all"])
    p.add_argument("--tier", default="default", help="default (about 45 minutes on 2 CPU cores each), converged "
                   "(trained until validation stops improving) or paper (the paper's protocol or scale); reports "
                   "of other tiers go to <out>/<suite>-<tier>/")
    p.add_argument("--seeds", type=int, default=None, help="seeds per run (default: the tier's own)")
    p.add_argument("--only", nargs="+", metavar="EXPERIMENT", help="run only these experiments (shell patterns, "
                   "e.g. 'mqar-*'); the report still lists them all")
    p.add_argument("--estimate", action="store_true", help="print the tier's training FLOPs as GPU-hours and stop")
    p.add_argument("--quick", action="store_true", help="the smoke version: a few steps per run")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every run's training steps")
    p.add_argument("--out", default="results", help="reports go to <out>/<suite>/")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("report", help="rebuild a suite's report and figures from its results.json alone")
    p.add_argument("folder", help="the folder attnlab reproduce wrote, e.g. results/boltzmann")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("results", help="the main tables of every reproduced suite, for the README")
    p.add_argument("--root", default="results", help="the folder attnlab reproduce wrote to")
    p.add_argument("--readme", help="write them between the results markers of this file instead of printing")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("bench", help="every mixer and op form timed side by side, against peers and goals")
    p.add_argument("--quick", action="store_true", help="the smoke preset (seconds) instead of the default (~10 min)")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json and the PNG plots")
    p.add_argument("--lengths", type=int, nargs="+", help="only the mixers alone, at these sequence lengths")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, help="timed repeats per contender (default 3; --model 10)")
    p.add_argument("--model", help="only training steps of this preset with each of --mixers (and softmax)")
    p.add_argument("--mixers", nargs="+", help="mixers for --model, or 'all' (default: the preset's)")
    p.add_argument("--boltzmann", action="store_true",
                   help="only Boltzmann attention: exact enumeration at T=8,12,16 and banded inference at T=256..4096")
    p.add_argument("--interdomain", action="store_true",
                   help="only interdomain's chunked vs FFT form at T=1K..16K (time, memory) and decode latency")
    p.add_argument("--ops", action="store_true",
                   help="only the op forms vs their references and peers (T=4096, or the last of --lengths)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("doctor", help="every mixer on this machine's GPU against fp64, timings, fla, a short training")
    p.add_argument("--out", default="runs/doctor", help="folder for doctor.json")
    p.add_argument("--train-steps", type=int, default=200, help="steps of the demo model (0: no training)")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as err:
        if args.debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
