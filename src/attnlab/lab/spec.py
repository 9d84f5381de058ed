"""What a suite declares: its experiments, their arms (a preset and its changes each) and the paper's claims.
Plain data, cheap to import; ``driver`` runs it, ``job`` trains and measures each run."""

from __future__ import annotations

from dataclasses import dataclass, field

SECTIONS = ("model", "data", "train")  # the sections of a run's config that an arm changes


@dataclass(frozen=True)
class Changes:
    """What an arm changes in its preset: config fields by their dotted keys, with Python values, applied in
    order (a later one wins). Built by section, `Changes.train(steps=400)`, and joined with `|`:
    `Changes.mixer("coupled-qk", steps=3) | Changes.train(steps=400)`. The loader types every value through the
    config's dataclasses, so a field that does not exist or a value of the wrong type is refused with its key."""

    pairs: tuple = ()  # ((dotted key, value), ...)

    def __post_init__(self):
        for key, _ in self.pairs:
            if key.split(".")[0] not in SECTIONS or "." not in key:
                raise ValueError(f"an arm changes fields of {', '.join(SECTIONS)}, not '{key}'")

    def __hash__(self):  # a plan's configs are cached by the arm's changes; a value may be a list
        return hash(repr(self.pairs))

    def __or__(self, other: Changes) -> Changes:
        return Changes(self.pairs + other.pairs)

    def __iter__(self):
        """The (key, value) pairs that load_config and apply_overrides take."""
        return iter(self.pairs)

    @classmethod
    def section(cls, name: str, **fields) -> Changes:
        return cls(tuple((f"{name}.{key}", value) for key, value in fields.items()))

    @classmethod
    def model(cls, **fields) -> Changes:
        return cls.section("model", **fields)

    @classmethod
    def data(cls, **fields) -> Changes:
        return cls.section("data", **fields)

    @classmethod
    def train(cls, **fields) -> Changes:
        return cls.section("train", **fields)

    @classmethod
    def options(cls, mixer: str, **options) -> Changes:
        """Options of one mixer (model.mixer_options.<mixer>.<option>), each set on its own."""
        return cls.section(f"model.mixer_options.{mixer}", **options)

    @classmethod
    def mixer(cls, mixer: str, **options) -> Changes:
        """Every layer this mixer, with these of its options."""
        return cls.model(mixer=mixer) | cls.options(mixer, **options)

    @classmethod
    def task(cls, task: str, **settings) -> Changes:
        """Settings of one task (data.task_options.<task>.<setting>), each set on its own."""
        return cls.section(f"data.task_options.{task}", **settings)


UNCHANGED = Changes()  # an arm that trains its preset as it is

# a suite's --quick smoke version: a few steps per run
QUICK = Changes.train(steps=20, eval_every=20, eval_batches=2, ckpt_every=20)
# the converged tiers' language models: at most 4,000 steps (the cosine schedule spans the cap), evaluated
# every 250 and stopped after 4 evaluations without a gain of 0.001 nats; compiled where the mixer compiles
# (about 1.2x faster per step for a character LM on one CPU thread, after some 20 s of compilation)
CONVERGED_LM = Changes.train(steps=4000, eval_every=250, patience=4, min_delta=0.001, ckpt_every=4000, compile=True)
# the protocol for patient and converged language-model experiments added from now on: CONVERGED_LM's evaluation
# and patience under the wsd schedule (train.schedule), whose rate holds at its peak and decays to min_lr over a
# fifth of train.steps (the default that --quick's 20 steps shorten with it), so that patience can end a run: where
# it runs out, the decay starts and the run stops when it ends, measured at its best checkpoint. Under cosine the
# rate reaches min_lr only at the cap, so the loss falls until the last steps and patience cannot run out first:
# every CONVERGED_LM language model ended at its cap. The cap, twice CONVERGED_LM's, is a bound that patience
# should reach first. The committed tiers keep CONVERGED_LM's cosine schedule: a run's fingerprint hashes its
# schedule, so changing theirs would invalidate their committed runs (some 100) instead of adding new ones
PATIENT_LM = Changes.train(steps=8000, eval_every=250, patience=4, min_delta=0.001, ckpt_every=8000, compile=True,
                           schedule="wsd")


def sweep_around(preset: str) -> list[float]:
    """The learning-rate sweep every arm of a language-model comparison gets: the preset's rate halved, as it
    is, and doubled (each arm at the one its first seed validates best), so that no arm is judged at a rate
    tuned for another mechanism."""
    from ..config import load_config  # imported here: this module stays cheap to import

    lr = load_config(preset).train.lr
    return [lr / 2, lr, 2 * lr]


# the key of val_ppl (and of the extrapolation's perplexity at the training length) measured with every mixer's
# own component removed at evaluation (Mixer.ablated)
ABLATED = "ablated_ppl"


def ablated(key: str) -> str:
    """The key of another metric's value measured with every mixer's own component removed at evaluation."""
    return f"ablated_{key}"


def is_ablated(key: str) -> bool:
    """Whether a record's key holds a value measured with the mechanism's own component removed."""
    return key.startswith(ablated(""))


@dataclass(frozen=True)
class Arm:
    label: str
    preset: str
    changes: Changes = UNCHANGED  # what the arm changes in its preset
    seeds: int | None = None  # at most this many seeds (a secondary arm of a costly experiment)
    # processes that train one run together under torchrun (attnlab's DDP, or FSDP where the preset sets
    # train.fsdp): the GPUs of one machine for a model too large or too slow for one
    ranks: int = 1

    def __post_init__(self):
        if not isinstance(self.changes, Changes):
            raise TypeError(f"arm {self.label!r}: its changes are a Changes, e.g. Changes.train(steps=400), "
                            f"not {self.changes!r}")


@dataclass
class Experiment:
    name: str
    title: str
    metric: str  # the name of a registered metric (metrics.METRICS): val_ppl, accuracy, niah, extrapolation, ...
    arms: list[Arm]
    baseline: str  # label of the arm the others are compared with
    paper: dict[str, str] = field(default_factory=dict)  # the paper's own numbers, by arm label
    note: str = ""
    seeds: int | None = None  # at most this many seeds (the costly experiments of a tier)
    lrs: list[float] = field(default_factory=list)  # a learning-rate sweep: each arm trains at the one of these
    # (extended past an edge that wins: sweep_rates) whose first seed reaches the lowest validation loss (sweep runs
    # are kept under "<name>/<arm>/lr=<lr>")
    # the experiment whose sweep chooses this one's rates: usually the same arms trained the same way, so the same
    # models measured again, or those arms trained longer (its sweep runs are not measured by this experiment too)
    sweep_of: str | None = None
    lengths: list[float] = field(default_factory=lambda: [1, 2, 3.5, 5])  # extrapolation: x training length
    target_losses: list[float] = field(default_factory=list)  # tokens_to_loss: training losses (nats) to reach
    # it measures the size of a mechanism's own learned component (a profile): the report shows it, with every
    # seed's values, beside the ablations at evaluation under "Is the mechanism used?"
    component: bool = False
    # the plan that runs it where a CPU cannot ("scripts/gpu-science.sh"): until it has runs, its claims' rows say
    # "GPU tier" and name that plan
    gpu: str = ""


@dataclass
class Suite:
    name: str
    title: str
    experiments: list[Experiment]
    quick: Changes = UNCHANGED  # the --quick smoke version's changes to every run
    source: str = ""
    seeds: int = 3
    tier: str = "default"
    gpu: bool = False  # sized for GPUs: `attnlab reproduce` prints its estimated GPU-hours before it starts
    claims: list = field(default_factory=list)  # the paper's claims (claims.Claim) that the report judges
    # where each mechanism's equations come from, by the marks of its implementation spec: the paper's text
    # ([P]), reconstructed ([E]) or inferred ([I]), and from what
    provenance: dict[str, str] = field(default_factory=dict)
    ablation: str = ""  # what Mixer.ablated removes from the suite's mechanism at evaluation, for the report
    # numbers of the paper's that no claim compares with but the report checks (claims.Anchor): one per reading of
    # an experiment that tries several readings of what the paper leaves unstated, against its one number
    anchors: list = field(default_factory=list)


def sensitivity(name: str, title: str, protocol: Experiment, arm: str, change: Changes) -> Experiment:
    """A labelled sensitivity run beside a protocol's experiment, not the protocol: its baseline (the protocol's
    own model, measured again) and one of its arms with one setting changed."""
    base, changed = (next(a for a in protocol.arms if a.label == label) for label in (protocol.baseline, arm))
    return Experiment(name, title, protocol.metric, [base, Arm(arm, changed.preset, changed.changes | change)],
                      protocol.baseline, lengths=protocol.lengths)


def seed_count(experiment: Experiment, arm: Arm, seeds: int) -> int:
    """How many seeds an arm trains: the suite's (or --seeds), capped by the experiment's and the arm's own."""
    return min(seeds, experiment.seeds or seeds, arm.seeds or seeds)


def arm_seeds(suite: Suite, seeds: int):
    """(experiment name, arm label) -> how many seeds that arm of the suite trains (0: no such arm)."""
    counts = {(e.name, a.label): seed_count(e, a, seeds) for e in suite.experiments for a in e.arms}
    return lambda experiment, arm: counts.get((experiment, arm), 0)


def sweep_source(suite: Suite, experiment: Experiment) -> Experiment | None:
    """The experiment whose learning-rate sweep sets this one's rates (itself, or the one it names), None if
    its arms train at their presets' rates."""
    if experiment.sweep_of is None:
        return experiment if experiment.lrs else None
    return next(e for e in suite.experiments if e.name == experiment.sweep_of)
