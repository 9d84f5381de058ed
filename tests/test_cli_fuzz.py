"""Every subcommand's options fuzzed: whatever is typed, attnlab exits with 0 (done) or 2 (one line saying what
to fix), never with a traceback. The commands that read a run use one tiny run trained once for the module;
those that would train or benchmark for long (train, demo, reproduce, bench, doctor) get only arguments that
must be refused before any work starts."""

import contextlib
import io
import string

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from attnlab.cli import main
from attnlab.config import list_presets
from attnlab.data.niah import NOISE
from attnlab.mixers import list_mixers

FUZZ = settings(max_examples=25, database=None)  # the profile of conftest: no timing health check, no deadline
FUZZ_MORE = settings(FUZZ, max_examples=50)  # the commands that do real work on the run, in a fraction of a second
COMMANDS = ["train", "eval", "generate", "list", "couplings", "demo", "reproduce", "report", "results", "bench",
            "doctor"]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# text that is no number: a count drawn from it can never ask for long work
junk = st.text(max_size=8).filter(lambda s: not _is_number(s))
numbers = st.one_of(st.integers().map(str), st.floats().map(str))


def small(low: int, high: int):
    """Counts and lengths: small ones, 0 and -1 often, or junk; never a long job."""
    return st.one_of(st.sampled_from(["0", "-1"]), st.integers(low, high).map(str), junk)


@st.composite
def options(draw, spec: dict, at_least: int = 0) -> list[str]:
    """argv pieces: some of the options of spec, each with a drawn value (a list: several, None: a flag)."""
    argv = []
    names = st.lists(st.sampled_from(sorted(spec)), unique=True, min_size=at_least, max_size=4) if spec else st.just([])
    for name in draw(names):
        value = draw(spec[name])
        argv += [name] if value is None else [name, *value] if isinstance(value, list) else [name, value]
    return argv


def run_cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:  # --help and --version exit from argparse itself
            code = exit.code
    return code, err.getvalue()


def assert_clean(argv: list[str], refused: bool = False) -> None:
    """Exit 0 or 2, no traceback, and a refusal is one 'error:' line (any notes before it aside)."""
    code, err = run_cli(argv)
    event(f"exit {code}")  # pytest --hypothesis-show-statistics: how many examples got past the checks
    assert code == 2 if refused else code in (0, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        lines = err.splitlines()
        assert lines[-1].startswith("error: ") and sum(line.startswith("error: ") for line in lines) == 1, (argv, err)


@pytest.fixture(scope="module", autouse=True)
def workdir(tmp_path_factory):
    """A folder of its own as the working directory (defaults like runs/demo land there) with a file in it."""
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "afile").write_text("not a folder")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("ATTNLAB_CACHE", str(folder / "cache"))
        yield folder


@pytest.fixture(scope="module")
def run(workdir) -> str:
    """A 2-step model on text that holds every character of the needle-in-a-haystack prompts."""
    lines = [f"Line {i}: the quick brown fox jumps over the lazy dog, {i % 7} times.\n" for i in range(300)]
    extra = NOISE + string.ascii_letters + string.digits + "-:?.\n"
    (workdir / "corpus.txt").write_text("".join(lines) + extra * 20, encoding="utf-8")
    overrides = ["name=tiny", "out_dir=runs", "data.source=text", "data.path=corpus.txt", "model.d_model=16",
                 "model.n_layers=1", "model.n_heads=2", "train.steps=2", "train.batch_size=2", "train.seq_len=16",
                 "train.eval_batches=1", "train.ckpt_every=2"]
    assert main(["train", "demo", *overrides, "--quiet"]) == 0
    return str(workdir / "runs" / "tiny")


GENERATE = {
    "--prompt": st.one_of(st.text(string.ascii_letters + " .?", max_size=12), st.text(max_size=12)),
    "--tokens": small(-3, 12),
    "--temperature": st.one_of(st.floats(-2, 3).map(str), st.sampled_from(["nan", "inf", "1e-300", "-0"]), junk),
    "--top-k": small(-3, 80),
    "--seed": st.one_of(numbers, junk),
    "--context": small(-3, 40),
}


@FUZZ_MORE
@given(options(GENERATE))
def test_generate(run, argv):
    assert_clean(["generate", run, *argv])


EVAL = {
    "--split": st.sampled_from(["train", "val", "test"]),
    "--batches": small(-2, 3),
    "--seq-len": st.one_of(small(-2, 48), st.just("1000000")),
    "--kind": st.one_of(st.sampled_from(["passkey", "number", "uuid", "multikey"]), junk),
    "--keys": st.one_of(st.just("2"), small(-1, 3)),
    "--samples": st.one_of(st.just("1"), small(-1, 1)),
    "--lengths": st.lists(small(-3, 260), min_size=1, max_size=2),
    "--out": st.sampled_from(["figures", "figures", "afile"]),
}
# the options each measurement reads, so that most examples get past the check that refuses the others
EVAL_TASKS = {None: ["--split", "--batches", "--seq-len"], "niah": ["--kind", "--keys", "--lengths"],
              "extrapolation": ["--lengths", "--out"], "mqar": [], "brackets": [], "nosuchtask": []}


@st.composite
def eval_options(draw) -> list[str]:
    task = draw(st.sampled_from(list(EVAL_TASKS)))
    argv = [] if task is None else ["--task", task]
    if task == "niah":  # few prompts per depth: the default of 10 makes a slow example
        argv += ["--samples", draw(EVAL["--samples"])]
    argv += draw(options({name: EVAL[name] for name in EVAL_TASKS[task]}))
    return argv + draw(st.one_of(st.just([]), options(EVAL, at_least=1)))  # and sometimes any other


@FUZZ_MORE
@given(eval_options())
def test_eval(run, argv):
    assert_clean(["eval", run, *argv])


@FUZZ
@given(st.one_of(st.sampled_from(list_mixers() + list_presets()), junk, st.none()),
       st.lists(st.one_of(junk, st.integers(-2, 64).map(lambda n: f"model.d_model={n}"),
                          st.sampled_from(["model.mixer=sofmax", "train.steps=0", "a.b=1"])), max_size=2))
def test_list(name, overrides):
    named = [] if name is None else [name]
    assert_clean(["list", *named, *overrides])
    if name == "demo" or name not in list_presets():  # --params builds every mixer: on small models only
        assert_clean(["list", "--params", *named, *overrides])


@FUZZ
@given(options({"--out": st.sampled_from(["figures", "afile"]), "--bogus": st.none()}))
def test_couplings(run, argv):
    assert_clean(["couplings", run, *argv], refused=True)  # the tiny run has no Boltzmann layer


@FUZZ
@given(st.lists(st.one_of(st.integers(-5, 0).map(lambda n: f"train.steps={n}"),
                          st.integers(-5, 0).map(lambda n: f"model.d_model={n}"),
                          junk.map(lambda s: f"model.mixer=x{s}"), junk.map(lambda s: f"nosuch.{s}=1"),
                          st.sampled_from(["--resume=nosuchfolder", "--bogus", "train.lr=-1"])),
                min_size=1, max_size=3))
def test_train_refuses_before_training(bad):
    assert_clean(["train", "demo", "out_dir=runs", *bad], refused=True)


@FUZZ
@given(options({"--out": st.sampled_from([".", "afile"]), "--bogus": st.none()}, at_least=1), st.booleans())
def test_demo_refuses_before_training(argv, quick):
    # "." holds files but no demo/: the demo, which replaces its folder, must not take it
    assert_clean(["demo", *argv, *(["--quick"] if quick else [])], refused=True)


@FUZZ
@given(st.one_of(junk.filter(lambda s: s not in ("ccq", "boltzmann", "coupled-qk", "interdomain", "all")),
                 st.sampled_from(["ccq", "all"])),
       options({"--seeds": st.one_of(st.integers(-3, 0).map(str), st.integers(1001, 10**12).map(str), junk),
                "--scale": st.one_of(st.floats(max_value=0).map(str), st.sampled_from(["nan", "inf"]), junk),
                "--tier": junk.filter(lambda s: s not in ("default", "converged", "paper"))}, at_least=1))
def test_reproduce_refuses_before_training(suite, argv):
    assert_clean(["reproduce", suite, *argv, "--out", "results"], refused=True)


@FUZZ
@given(options({
    "--lengths": st.lists(st.one_of(st.integers(-3, 0).map(str), junk), min_size=1, max_size=2),
    "--batch": st.one_of(st.integers(-3, 0).map(str), junk),
    "--repeats": st.one_of(st.integers(-3, 0).map(str), junk),
    "--mixers": st.lists(junk.filter(lambda s: s not in list_mixers() + ["all"]), min_size=1, max_size=2),
    "--model": junk.filter(lambda s: s not in [*list_presets(), "afile"]),
    "--out": st.just("afile"),
}, at_least=1), st.lists(st.sampled_from(["--ops", "--boltzmann", "--interdomain", "--packed", "--quick"]), unique=True,
                         max_size=2))
def test_bench_refuses_before_benchmarking(argv, views):
    assert_clean(["bench", *argv, *views], refused=True)


@FUZZ
@given(options({"--train-steps": st.one_of(st.integers(max_value=-1).map(str), junk), "--out": st.just("afile"),
                "--bogus": st.none()}, at_least=1))
def test_doctor_refuses_before_running(argv):
    assert_clean(["doctor", *argv], refused=True)


@FUZZ
@given(st.one_of(junk, st.sampled_from(["afile", ".", "runs"])),
       options({"--root": st.one_of(junk, st.just("runs")), "--readme": st.one_of(junk, st.just("runs"))}))
def test_report_and_results(folder, argv):
    assert_clean(["report", folder])
    assert_clean(["results", *argv])


@FUZZ
@given(st.lists(st.one_of(junk, numbers, st.sampled_from(["--debug", "--help", "--version", "-h"])), max_size=4)
       .filter(lambda argv: not set(argv) & set(COMMANDS)))
def test_anything_else(argv):
    assert_clean(argv)
