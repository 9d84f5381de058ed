"""The ``attnlab`` command: train | eval | generate | export | list | demo | reproduce | report | results |
bench | doctor, and the commands a paper registers (``experiments.register_command``: couplings).

Arguments are checked in one layer before any work starts (``attnlab.arguments``), and against the
loaded run (its vocabulary, its data) where a value depends on the run. Every mistake is one line naming
the argument and the fix, and exits with code 2. Parsing imports neither torch nor the experiments: each
command imports what it needs, so that --help answers at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import json
import os
import sys
import traceback
from dataclasses import MISSING, fields
from pathlib import Path

from . import plugins
from .arguments import (
    RUN,
    Parser,
    bench_flag,
    check_bench,
    check_demo,
    check_doctor,
    check_eval,
    check_list,
    check_reproduce,
    check_results,
    check_train,
    context_size,
    non_empty,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    seed_count,
    seed_value,
    temperature,
)
from .errors import UserError, unknown_name

# ---------------------------------------------------------------------------------------------------
# subcommands


def cmd_train(args) -> None:
    from .config import load_config
    from .train import train

    cfg = load_config(args.config, args.overrides)
    # a bar redraws in place on a terminal; written to a file or a pipe it would be one line per refresh
    progress = not args.quiet and sys.stderr.isatty()
    summary = train(cfg, resume=args.resume, progress=progress, overrides=args.overrides)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 speaks for all
        print(f"done: val loss {summary['val_loss']:.4f}, perplexity {summary['val_ppl']:.2f}, "
              f"checkpoints in {summary['run_dir']}")


def cmd_eval(args) -> None:
    from .inference import load_run

    if args.lm_eval:
        _eval_lm_eval(args)
        return
    from .data import TASKS
    from .data.tasks import trained_on_text

    run = load_run(args.checkpoint)
    if args.task is None:
        _eval_loss(run, args)
        return
    if args.task not in [*TASKS, "extrapolation"]:  # the tasks the run's own plugins register included
        raise UserError(unknown_name("--task", args.task, [*TASKS, "extrapolation"]))
    task = TASKS.get(args.task)  # else perplexity against the context length, on text
    fits, needs = (task.fits_run(run), task.needed()) if task else (trained_on_text(run), "a run trained on text")
    if not fits:
        raise UserError(f"--task {args.task} needs {needs}; {run.folder} was trained on "
                        f"data.source={run.config.data.source}")
    (task.evaluate if task else _eval_extrapolation)(run, args)


def _check_window(run, corpus, split: str, length: int, option: str) -> None:
    """A window of `length` tokens reads length + 1 of the split (its targets are shifted by one)."""
    tokens = len(corpus.split(split))
    if length + 1 > tokens:
        raise UserError(f"{option} {length}: the {split} split of {run.folder} holds {tokens:,} tokens, too few for "
                        f"one window; give {option} up to {tokens - 1}")


def _eval_loss(run, args) -> None:
    from . import evaluate
    from .data.tasks import trained_on_text

    t = run.config.train
    split, seq_len = args.split or "val", args.seq_len or t.seq_len
    corpus = run.corpus()
    if args.seq_len is not None and not trained_on_text(run):
        raise UserError(f"--seq-len applies to runs trained on text; {run.folder} has the fixed-length examples "
                        f"of data.source={run.config.data.source}")
    if trained_on_text(run):
        _check_window(run, corpus, split, seq_len, "--seq-len")
    micro_batch = t.batch_size // t.grad_accum
    # by default every position of the split once; --batches: that many batches of random windows, as training's
    # validation with train.eval_batches reads them
    batches = args.batches or 0
    loss = evaluate.split_loss(run.model, corpus, split, batches, t.batch_size, seq_len, run.device, chunk=micro_batch,
                               packed=run.config.data.pack)  # documents as the run trained on them
    if batches:
        scored = f"{batches} batch{'es' if batches > 1 else ''} of {t.batch_size} x {seq_len} tokens, --batches"
    else:
        scored = f"every position of the split once, {evaluate.scored_positions(corpus, split):,} tokens in " \
                 f"windows of {seq_len}"
    print(f"{run.folder}: {split} loss {loss:.4f} nats/token, perplexity {evaluate.perplexity(loss):.2f} ({scored})")


def _eval_extrapolation(run, args) -> None:
    from . import evaluate, plots

    t = run.config.train
    lengths = args.lengths or [round(t.seq_len * f) for f in (1, 2, 3.5, 5)]
    corpus = run.corpus()
    for length in lengths:
        _check_window(run, corpus, "val", length, "--lengths")
    curve = evaluate.perplexity_by_length(run.model, corpus, lengths, device=run.device)
    for length, ppl in curve.items():
        print(f"context {length:>6} ({length / t.seq_len:.1f}x training): perplexity {ppl:.3f}")
    folder = Path(args.out or run.folder.parent)
    folder.mkdir(parents=True, exist_ok=True)
    path = plots.plot_perplexity_by_length({run.config.model.mixer: curve}, folder / "extrapolation.png", t.seq_len)
    print(f"figure: {path}")


def _eval_lm_eval(args) -> None:
    """lm-evaluation-harness tasks on the run, through attnlab's model type (attnlab.harness)."""
    _needs("lm_eval", "--lm-eval", "eval")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    from .harness import AttnlabLM

    tasks = TaskManager(include_path=args.include_path)
    for task in args.lm_eval:
        if task not in tasks.all_tasks:
            close = difflib.get_close_matches(task, tasks.all_tasks, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UserError(f"--lm-eval: unknown task '{task}'{hint} (lm-eval ls tasks lists them; your own task "
                            "YAML files: --include-path DIR)")
    model = AttnlabLM(args.checkpoint, batch_size="auto")  # requests packed into one row per forward
    results = simple_evaluate(model=model, tasks=args.lm_eval, task_manager=tasks, limit=args.limit, log_samples=False)
    print(make_table(results))


def cmd_export(args) -> None:
    _needs("transformers", "attnlab export", "hf")
    from .hf.export import export

    _check_built_in_mixers(args.checkpoint)
    folder = export(args.checkpoint, args.folder)
    print(f"{folder}: AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained load it after "
          "import attnlab, or with trust_remote_code=True without it")


def _check_built_in_mixers(path: str) -> None:
    """The exported folder carries attnlab's code (for trust_remote_code) and so only attnlab's own mixers."""
    from . import checkpoint
    from .config import RunConfig
    from .mixers import mixer_class
    from .typed import from_dict

    config = from_dict(RunConfig, checkpoint.load_config(checkpoint.resolve_checkpoint(path))).validate()
    for name in config.mixers():
        module = mixer_class(name).__module__
        if module.split(".")[0] != "attnlab":
            origin = plugins.source_of(mixer_class(name)) or module
            raise UserError(f"attnlab export: mixer '{name}' comes from {origin}, not attnlab, and an exported "
                            "folder can carry attnlab's mixers only; export a run of built-in mixers")


def _needs(package: str, what: str, extra: str) -> None:
    """One line naming the extra to install, instead of an ImportError from deep inside."""
    if importlib.util.find_spec(package) is None:
        raise UserError(f"{what} needs {package}: pip install 'attnlab[{extra}]'")


def cmd_generate(args) -> None:
    from .inference import load_run

    run = load_run(args.checkpoint)
    prompt = _check_prompt(run, args.prompt)
    context = -1 if args.context is None else (args.context or None)
    texts = run.complete(prompt, args.tokens, args.temperature, args.top_k, args.seed, context, top_p=args.top_p,
                         repetition_penalty=args.repetition_penalty, stop=args.stop, num_samples=args.samples)
    for i, text in enumerate(texts, 1):
        if len(texts) > 1:
            print(f"--- sample {i} of {len(texts)} ---")
        print(text)


def _check_prompt(run, prompt: str | None) -> str:
    """The prompt to continue: --prompt, which the run's tokenizer must encode into at least one token, or
    a newline when it is not given and the run reads text (a run on token ids has no text to start from)."""
    reads_ids = run.tokenizer.kind == "ids"
    if prompt is None and not reads_ids:
        return "\n"
    try:
        ids = run.tokenizer.encode(prompt or "")
    except UserError as err:
        raise UserError(f"--prompt: {err}" + ("" if reads_ids else "; write the prompt without them")) from None
    if len(ids) == 0:  # text always encodes to tokens: this is a run on token ids given none
        given = "no --prompt" if prompt is None else f"--prompt {prompt!r} holds no tokens"
        raise UserError(f"{given}: this run was trained on data.source={run.config.data.source}, whose tokens are "
                        f"ids; give --prompt with ids from 0 to {run.tokenizer.vocab_size - 1} separated by spaces, "
                        "e.g. --prompt '3 1 4'")
    return prompt


def cmd_list(args) -> None:
    from .config import list_presets
    from .mixers import list_mixers

    if args.params:
        _list_params(args.name, args.overrides)
        return
    print("mixers: set a field with model.mixer_options.<mixer>.<field>=<value> (d_model and n_heads come from "
          "model.*)")
    for name in [args.name] if args.name else list_mixers():
        _list_fields(name)
    if not args.name:
        print("presets:", ", ".join(list_presets()))


def _list_fields(name: str) -> None:
    """A mixer's own config fields: name, type, default and the comment that documents it in the source."""
    from .mixers import MixerConfig, mixer_class
    from .typed import field_docs

    cls = mixer_class(name)
    summary = describe(cls)
    print(f"  {name}: {summary}" if summary else f"  {name}")
    shared = {f.name for f in fields(MixerConfig)}  # set by the model for every layer
    docs = field_docs(cls.config_class)
    for f in fields(cls.config_class):
        if f.name in shared:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        print(f"    {f.name:<22} {kind:<6} {default!r:<12} {docs[f.name]}".rstrip())


def describe(mixer_class) -> str:
    """A mixer's description: the first paragraph of its class docstring, on one line."""
    paragraph = (mixer_class.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _list_params(config: str | None, overrides: list[str]) -> None:
    import torch

    from .config import load_config
    from .mixers import list_mixers
    from .model import Decoder

    cfg = load_config(config, overrides)
    base, vocabulary = _model_as_trained(cfg)
    print(f"{config or 'default'} model, vocab {base.vocab_size:,} ({vocabulary}), state at T={cfg.train.seq_len}:")
    print(f"  {'mixer':<22} {'parameters':>12} {'vs softmax':>11} {'state numbers':>14}")
    baseline = None
    for name in ["softmax"] + [m for m in list_mixers() if m != "softmax"]:
        try:
            with torch.device("meta"):  # shapes only: counting needs no memory or initialisation
                model = Decoder(dataclasses.replace(base, mixer=name, layers=None))
        except UserError as err:
            print(f"  {name:<22} (not buildable with this config: {err})")
            continue
        n = model.num_params()
        baseline = baseline or n
        print(f"  {name:<22} {n:>12,} {100 * (n / baseline - 1):>+10.3f}% {model.state_size(cfg.train.seq_len):>14,}")


def _model_as_trained(cfg):
    """The model config that train would build, with its vocabulary (and a task's pointer head) fitted to the
    data as train fits them, and how the vocabulary was found. A BPE is not trained here, nor a Hugging Face
    corpus downloaded: their vocabulary is the bound that sized_model gives."""
    from .data import TASKS, load_data
    from .train import fit_to_data

    data = cfg.data
    local = data.tokenizer != "bpe" and not data.source.startswith("hf:")
    if data.source in TASKS or local:  # a task's tokens, or local text read once (and cached for train)
        return fit_to_data(cfg.model, load_data(data, cfg.train.seq_len)), "fitted to the data, as train builds it"
    if cfg.model.vocab_size:
        return cfg.model, "model.vocab_size"
    if data.tokenizer == "bpe":
        return cfg.sized_model(), "data.bpe_vocab: the BPE, trained when the run starts, may stop below it"
    return cfg.sized_model(), "at most: train fits it to the corpus, which is not downloaded here"


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo(out_dir=args.out, quick=args.quick)


def cmd_reproduce(args) -> None:
    from fnmatch import fnmatch

    from .experiments import PAPERS, get_suite
    from .experiments.report import write_report
    from .experiments.runner import run_suite

    if args.suite not in (*PAPERS, "all"):
        raise UserError(unknown_name("suite", args.suite, [*PAPERS, "all"]))
    names = [n for n in PAPERS if args.tier in PAPERS[n].TIERS] if args.suite == "all" else [args.suite]
    if not names:
        raise UserError(f"no suite has a tier '{args.tier}'; see attnlab reproduce --help")
    suites = {name: get_suite(name, args.tier) for name in names}  # every name and tier checked before any run
    if args.only and not any(fnmatch(e.name, p) for s in suites.values() for e in s.experiments for p in args.only):
        raise UserError(f"--only {' '.join(args.only)} matches no experiment of {', '.join(names)}")
    if args.arms and not any(_has_arm(s, args.arms) for s in suites.values()):
        raise UserError(f"--arms {' '.join(args.arms)} matches no arm of {', '.join(names)}")
    for name, suite in suites.items():
        if suite.gpu or args.estimate:
            from .experiments.gpu import describe_estimate

            print(f"{name} ({args.tier}): {describe_estimate(suite, seeds=args.seeds)}")
        if args.estimate:
            continue
        if args.only and not any(fnmatch(e.name, p) for e in suite.experiments for p in args.only):
            continue  # (all) this suite has none of the experiments asked for
        if args.arms and not _has_arm(suite, args.arms):
            continue  # (all) nor any of the arms
        # smoke and rescaled runs get folders of their own: they never mix with, or overwrite, real results
        variant = "-quick" if args.quick else (f"-scale{args.scale:g}" if args.scale != 1 else "")
        out = Path(args.out) / f"{name}{'' if args.tier == 'default' else '-' + args.tier}{variant}"
        results = run_suite(suite, out, seeds=args.seeds, quick=args.quick, scale=args.scale, only=args.only or (),
                            arms=args.arms or ())
        print(f"report: {write_report(suite, results, out)}")


def _has_arm(suite, patterns: list[str]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(a.label, p) for e in suite.experiments for a in e.arms for p in patterns)


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
        doctor_run = Path(args.root) / "doctor" / "doctor.json"
        if doctor_run.exists():  # the GPU section, from the committed doctor run
            from .doctor import readme_section

            update_readme(args.readme, readme_section(json.loads(doctor_run.read_text())), section="doctor")
            print(f"updated the doctor section of {args.readme} from {doctor_run}")
    else:
        print(summary)


def cmd_bench(args) -> None:
    from . import bench
    from .experiments import BENCH_CASES

    case = next((case for name, case in BENCH_CASES.items() if getattr(args, bench_flag(name))), None)
    if case:
        case.run()
    elif args.packed:
        bench.bench_packed(seq_len=(args.lengths or [512])[-1], repeats=args.repeats or 3)
    elif args.ops:
        bench.bench_ops(seq_len=(args.lengths or [4096])[-1], repeats=args.repeats or 3)
    elif args.model:
        bench.bench_training_step(args.model, args.mixers, repeats=args.repeats or 10)
    elif args.lengths:
        bench.bench_mixers(lengths=args.lengths, batch=args.batch or 1, repeats=args.repeats or 3)
    else:
        bench.run_bench("quick" if args.quick else "default", args.out)


def cmd_doctor(args) -> None:
    from .doctor import run_doctor

    run_doctor(args.out, args.train_steps, args.dry_run)


# ---------------------------------------------------------------------------------------------------
# the parser

TRAIN_EPILOG = """\
overrides set any field of the config's dataclasses (attnlab/config.py: model, data, train), e.g.
  attnlab train demo model.mixer=sigmoid train.steps=500
  attnlab train demo model.layers=[softmax,gla,softmax,gla]            (a hybrid: one mixer per layer)
and a mixer's own fields with model.mixer_options.<mixer>.<field>=<value>, e.g.
  attnlab train demo model.mixer=gla model.mixer_options.gla.chunk_size=32
attnlab list <mixer> shows a mixer's fields with their types, defaults and meaning."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnlab")
    except PackageNotFoundError:  # run from a source tree without installing it
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnlab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"attnlab {_version()}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for user errors too")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="import a module or .py file that registers mixers first (repeatable; also "
                        f"{plugins.ENV_VAR}=mod1,mod2 and the entry points {plugins.ENTRY_POINTS})")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _paper_parsers(sub) -> None:
    """The papers' own commands (`experiments.register_command`): inspections of what their mechanisms learned."""
    from .experiments import COMMANDS  # declarations only: cheap to import

    for add in COMMANDS:
        add(sub)


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a model from a preset or YAML file plus dotted overrides",
                       epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="preset name (attnlab list) or path to a YAML file")
    p.add_argument("overrides", nargs="*", help="section.field=value, e.g. model.mixer=sigmoid train.steps=500")
    p.add_argument("--resume", type=non_empty,
                   help="'auto' (newest intact checkpoint of the run) or a checkpoint folder")
    p.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a "
                   "terminal: logs get the validation lines only)")
    p.set_defaults(func=cmd_train, check=check_train)


def _eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="loss and perplexity of a checkpoint on its data, or a task's accuracy")
    p.add_argument("checkpoint", help=RUN)
    p.add_argument("--split", choices=["train", "val"], help="the split the loss is measured on (default: val)")
    p.add_argument("--batches", type=positive_int,
                   help="average over this many batches of random windows, as training's validation does "
                   "(default: every position of the split once)")
    p.add_argument("--seq-len", type=positive_int, help="context length of the loss (default: the training one)")
    p.add_argument("--task", help="a registered task's measurement: mqar or brackets (accuracy on its test set), "
                   "niah (needle-in-a-haystack retrieval in held-out text) or one from --import; or extrapolation "
                   "(perplexity against context length)")
    p.add_argument("--kind", choices=["passkey", "number", "uuid"], help="--task niah: the needle (default: passkey)")
    p.add_argument("--samples", type=positive_int, help="--task niah: prompts per depth (default: 10)")
    p.add_argument("--lengths", type=positive_int, nargs="+",
                   help="--task niah/extrapolation: context lengths in tokens (default: multiples of the training one)")
    p.add_argument("--out", help="--task extrapolation: folder for the figure (default: the run folder)")
    p.add_argument("--lm-eval", nargs="+", metavar="TASK", help="lm-evaluation-harness tasks instead "
                   "(pip install 'attnlab[eval]')")
    p.add_argument("--include-path", help="--lm-eval: a folder of your own task YAML files")
    p.add_argument("--limit", type=positive_int, help="--lm-eval: at most this many examples per task")
    p.set_defaults(func=cmd_eval, check=check_eval)


def _generate_parser(sub) -> None:
    p = sub.add_parser("generate", help="sample text from a checkpoint")
    p.add_argument("checkpoint", help=RUN)
    p.add_argument("--prompt", type=non_empty, help="text to continue (default: a newline; a run on token ids "
                   "needs one, e.g. '3 1 4')")
    p.add_argument("--tokens", type=positive_int, default=300, help="most tokens to sample (default: %(default)s)")
    p.add_argument("--temperature", type=temperature, default=0.8,
                   help="softmax temperature; 0 picks the most likely token (default: %(default)s)")
    p.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=probability, help="sample among the fewest most likely tokens whose "
                   "probability reaches p (default: all)")
    p.add_argument("--repetition-penalty", type=positive_float, default=1.0, help="divide the positive logits "
                   "of tokens already in the text by it and multiply the negative ones (default: 1, none)")
    p.add_argument("--stop", type=non_empty, action="append", default=[], metavar="TEXT",
                   help="end a sample where it writes TEXT, cut before it; may be given several times")
    p.add_argument("--samples", type=positive_int, default=1, help="independent samples (default: 1)")
    p.add_argument("--seed", type=seed_value, default=0, help="random seed of the sampling (default: %(default)s)")
    p.add_argument("--context", type=context_size,
                   help="most tokens the model sees at once (default: its training length; 0: unbounded)")
    p.set_defaults(func=cmd_generate)


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="a run as a Hugging Face transformers folder (AutoModelForCausalLM)")
    p.add_argument("checkpoint", help=RUN)
    p.add_argument("folder", help="a new or empty folder for config.json, the weights and the tokenizer")
    p.set_defaults(func=cmd_export)


def _list_parser(sub) -> None:
    p = sub.add_parser("list", help="mixers with their fields, and presets; --params compares parameter counts")
    p.add_argument("--params", action="store_true", help="parameters and state of every mixer on a model")
    p.add_argument("name", nargs="?", help="a mixer: only its fields; with --params, a preset or YAML file "
                   "(default: the default model)")
    p.add_argument("overrides", nargs="*", help="with --params: section.field=value changes to the model")
    p.set_defaults(func=cmd_list, check=check_list)


def _demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="every mechanism on a language-modelling and a retrieval task (CPU, minutes)")
    p.add_argument("--out", default="runs/demo", help="folder for the runs and report, replaced if it holds an "
                   "earlier demo (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a few steps per model: a smoke test")
    p.set_defaults(func=cmd_demo, check=check_demo)


def _reproduce_parser(sub) -> None:
    from .experiments import PAPERS  # declarations only: cheap to import

    p = sub.add_parser("reproduce", help="a paper's claims in miniature over seeds, with a report")
    # checked when the command runs, after --import has registered any other suite
    p.add_argument("suite", help=f"the paper's suite ({', '.join(PAPERS)}, or one that --import registers), or "
                   "all of them")
    p.add_argument("--tier", default="default", help="default (about 45 minutes on 2 CPU cores each), converged "
                   "(trained until validation stops improving) or paper (the paper's protocol or scale); reports "
                   "of other tiers go to <out>/<suite>-<tier>/")
    p.add_argument("--seeds", type=seed_count, help="seeds per run, 1 to 1000 (default: the tier's own)")
    p.add_argument("--only", nargs="+", metavar="EXPERIMENT", help="run only these experiments (shell patterns, "
                   "e.g. 'mqar-*'); the report still lists them all")
    p.add_argument("--arms", nargs="+", metavar="ARM", help="train only these arms of them (shell patterns, e.g. "
                   "'h+*'), so that two processes can share a suite's runs")
    p.add_argument("--estimate", action="store_true", help="print the tier's training FLOPs as GPU-hours and stop")
    p.add_argument("--quick", action="store_true", help="the smoke version: a few steps per run")
    p.add_argument("--scale", type=positive_float, default=1.0, help="multiply every run's training steps")
    p.add_argument("--out", default="results", help="reports go to <out>/<suite>/")
    p.set_defaults(func=cmd_reproduce, check=check_reproduce)


def _report_parser(sub) -> None:
    p = sub.add_parser("report", help="rebuild a suite's report and figures from its results.json alone")
    p.add_argument("folder", help="the folder attnlab reproduce wrote, e.g. results/<suite>")
    p.set_defaults(func=cmd_report)


def _results_parser(sub) -> None:
    p = sub.add_parser("results", help="the main tables of every reproduced suite, for the README")
    p.add_argument("--root", default="results", help="the folder attnlab reproduce wrote to")
    p.add_argument("--readme", help="write them between the results markers of this file instead of printing")
    p.set_defaults(func=cmd_results, check=check_results)


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="every mixer and op form timed side by side, against peers and goals")
    view = p.add_mutually_exclusive_group()  # each picks what the run measures: one at a time
    view.add_argument("--quick", action="store_true",
                      help="the smoke preset (seconds) instead of the default (~10 min)")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json and the PNG plots")
    p.add_argument("--lengths", type=positive_int, nargs="+", help="only the mixers alone, at these sequence lengths")
    p.add_argument("--batch", type=positive_int, help="--lengths: sequences per batch (default: 1)")
    p.add_argument("--repeats", type=positive_int, help="timed repeats per contender (default 3; --model 10)")
    view.add_argument("--model", type=non_empty,
                      help="only training steps of this preset with each of --mixers (and softmax)")
    p.add_argument("--mixers", nargs="+", help="mixers for --model, or 'all' (default: the preset's)")
    from .experiments import BENCH_CASES  # declarations only: cheap to import

    for name, case in BENCH_CASES.items():  # the papers' own cases
        view.add_argument(f"--{name}", dest=bench_flag(name), action="store_true", help=case.help)
    view.add_argument("--packed", action="store_true",
                      help="only training steps on packed documents against plain rows of the same tokens, every mixer")
    view.add_argument("--ops", action="store_true",
                      help="only the op forms vs their references and peers (T=4096, or the last of --lengths)")
    p.set_defaults(func=cmd_bench, check=check_bench)


def _doctor_parser(sub) -> None:
    p = sub.add_parser("doctor", help="every mixer on this machine's GPU against fp64, timings, fla, a short training")
    p.add_argument("--out", default="runs/doctor", help="folder for doctor.json")
    p.add_argument("--train-steps", type=non_negative_int, default=200,
                   help="steps of the demo model (0: no training)")
    p.add_argument("--dry-run", action="store_true",
                   help="the GPU run's timed sections too, at tiny sizes and unjudged, on whatever device is here")
    p.set_defaults(func=cmd_doctor, check=check_doctor)


# each adds one subcommand's parser, in the order --help lists them
SUBCOMMANDS = (
    _train_parser, _eval_parser, _generate_parser, _export_parser,
    _list_parser, _paper_parsers, _demo_parser, _reproduce_parser,
    _report_parser, _results_parser, _bench_parser, _doctor_parser,
)


def parse_args(argv=None) -> argparse.Namespace:
    """The parsed command line. Dotted overrides may also follow options (train demo --quiet train.steps=5),
    which argparse alone leaves unparsed."""
    args, extra = build_parser().parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")]
    if "--import" in stray:
        raise UserError(f"--import goes before the command: attnlab --import MODULE_OR_FILE {args.command} ...")
    if stray:
        raise UserError(f"unrecognized arguments: {' '.join(stray)} (see attnlab {args.command} --help)")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines())


def import_plugins(argv=None) -> None:
    """The installed plugins and those of --import, before the parser is built: a plugin's suites, bench cases and
    commands become choices and subcommands of their own."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((i for i, arg in enumerate(argv) if not arg.startswith("-") and argv[i - 1:i] != ["--import"]),
                   len(argv))  # options after the command are the command's (parse_args refuses --import there)
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--import", dest="imports", action="append", default=[])
    plugins.import_installed()
    for spec in early.parse_known_args(argv[:command])[0].imports:
        plugins.import_plugin(spec, "--import")


def main(argv=None) -> int:
    debug = False
    try:
        import_plugins(argv)
        args = parse_args(argv)
        debug = args.debug
        if hasattr(args, "check"):
            args.check(args)
        args.func(args)
    # an OSError is a file or folder that cannot be read or written: the user's to fix, like a bad argument
    except (UserError, OSError) as err:
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
