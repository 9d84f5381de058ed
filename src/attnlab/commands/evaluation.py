"""attnlab eval: a run's loss and perplexity, a task's measurement, perplexity by context length, or
lm-evaluation-harness tasks. The loss is on the run's own data, and the task a registered one."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from ..arguments import RUN, check_folder, positive_int, require_extra
from ..errors import UserError, unknown_name
from ..paths import user_path
from ..typed import from_dict


def add_parser(sub) -> None:
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
    p.add_argument("--kind", help="--task niah: the needle, passkey, number, uuid or multikey (RULER's S-NIAH-1, "
                   "-2, -3 and MK-NIAH-1; default: the run's own if it trained on data.source=niah, else passkey)")
    p.add_argument("--keys", type=positive_int, help="--task niah --kind multikey: needles in the haystack, one "
                   "asked for (default: the run's own if it trained on data.source=niah, else 4)")
    p.add_argument("--samples", type=positive_int, help="--task niah: prompts per depth (default: 10)")
    p.add_argument("--lengths", type=positive_int, nargs="+",
                   help="--task niah/extrapolation: context lengths in tokens (default: multiples of the training one)")
    p.add_argument("--out", help="--task extrapolation: folder for the figure (default: the run folder)")
    p.add_argument("--lm-eval", nargs="+", metavar="TASK", help="lm-evaluation-harness tasks instead "
                   "(pip install 'attnlab[eval]')")
    p.add_argument("--include-path", help="--lm-eval: a folder of your own task YAML files")
    p.add_argument("--limit", type=positive_int, help="--lm-eval: at most this many examples per task")
    p.set_defaults(func=main, check=check)


# the options each measurement but a task reads (None: loss and perplexity); one given to another would be ignored
OPTIONS = {"split": (None,), "batches": (None,), "seq_len": (None,), "lengths": ("extrapolation",),
           "out": ("extrapolation",), "include_path": ("lm-eval",), "limit": ("lm-eval",)}
# the options a registered task reads where its eval_options dataclass has a field of that name
TASK_OPTIONS = ("kind", "keys", "samples", "lengths")


def _measurement(task: str | None) -> str:
    return {None: "the loss (no --task)", "lm-eval": "--lm-eval"}.get(task, f"--task {task}")


def _readers(name: str) -> tuple:
    """The measurements that read option `name`: the registered tasks whose settings have it, then the others."""
    from ..data import TASKS

    tasks = [task for task, t in TASKS.items() if name in {f.name for f in dataclasses.fields(t.eval_options)}]
    return (*tasks, *OPTIONS.get(name, ()))


def check(args) -> None:
    if args.lm_eval and args.task:
        raise UserError(f"--task {args.task} and --lm-eval are two measurements; give one of them")
    _refuse_unread_options(args)
    check_folder(args.out, "--out")
    if args.include_path is not None and not user_path(args.include_path).is_dir():
        raise UserError(f"--include-path {args.include_path} is not a folder; give the folder of your task YAML files")


def _refuse_unread_options(args) -> None:
    """An option that the measurement does not read is refused. A task that a run's own plugin registers is
    checked once the run is loaded (main calls this again)."""
    from ..data import TASKS

    measurement = "lm-eval" if args.lm_eval else args.task
    if measurement not in (None, "lm-eval", "extrapolation", *TASKS):
        return
    for name in [*OPTIONS, *TASK_OPTIONS]:
        readers = _readers(name)
        if getattr(args, name) is not None and measurement not in readers:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} applies to {' and '.join(map(_measurement, readers))}, not to "
                            f"{_measurement(measurement)}; drop it")


def main(args) -> None:
    from ..inference import load_run

    if args.lm_eval:
        _lm_eval(args)
        return
    from ..data import TASKS
    from ..data.tasks import trained_on_text

    run = load_run(args.checkpoint)
    if args.task is None:
        _loss(run, args)
        return
    if args.task not in [*TASKS, "extrapolation"]:  # the tasks the run's own plugins register included
        raise UserError(unknown_name("--task", args.task, [*TASKS, "extrapolation"]))
    _refuse_unread_options(args)
    task = TASKS.get(args.task)  # else perplexity against the context length, on text
    fits, needs = (task.fits_run(run), task.needed()) if task else (trained_on_text(run), "a run trained on text")
    if not fits:
        raise UserError(f"--task {args.task} needs {needs}; {run.folder} was trained on "
                        f"data.source={run.config.data.source}")
    if task is None:
        _extrapolation(run, args)
        return
    given = {name: getattr(args, name) for name in TASK_OPTIONS if getattr(args, name) is not None}
    task.evaluate(run, from_dict(task.eval_options, given, f"--task {args.task}"))


def _check_window(run, corpus, split: str, length: int, option: str) -> None:
    """A window of `length` tokens reads length + 1 of the split (its targets are shifted by one)."""
    tokens = len(corpus.split(split))
    if length + 1 > tokens:
        raise UserError(f"{option} {length}: the {split} split of {run.folder} holds {tokens:,} tokens, too few for "
                        f"one window; give {option} up to {tokens - 1}")


def _loss(run, args) -> None:
    from .. import evaluate
    from ..data.tasks import trained_on_text

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
    elif not trained_on_text(run):
        scored = f"every example of the split once, {evaluate.scored_positions(corpus, split):,} scored targets"
    else:
        scored = f"every position of the split once, {evaluate.scored_positions(corpus, split):,} tokens in " \
                 f"windows of {seq_len}"
    print(f"{run.folder}: {split} loss {loss:.4f} nats/token, perplexity {evaluate.perplexity(loss):.2f} ({scored})")


def _extrapolation(run, args) -> None:
    from .. import evaluate, plots

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


def _lm_eval(args) -> None:
    """lm-evaluation-harness tasks on the run, through attnlab's model type (attnlab.hf.lm_eval)."""
    require_extra("lm_eval", "--lm-eval", "eval")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    from ..hf.lm_eval import AttnlabLM

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
