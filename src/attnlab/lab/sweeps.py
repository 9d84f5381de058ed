"""Learning-rate sweeps: which rates an arm tries, which one it keeps, and when arms share one.

The policy over losses only: the planner reads the results and hands the losses in (and the pairs of arms an
experiment compares, which share a rate where their sweeps cannot separate rates); its decisions come back as
the types below, which the plan carries and the report reads (`Sweep`, `SharedRate`, `Waiting`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SWEEP_EXTENSIONS = 2  # the most rates an arm's sweep adds beyond the edges of its grid


@dataclass(frozen=True)
class Waiting:
    """A rate not known yet, and what it waits for ("the sweep of lm/gla")."""

    why: str


@dataclass(frozen=True)
class Sweep:
    """One arm's learning-rate sweep as the results know it.

    losses: each rate tried (sweep_rates) -> its first seed's validation loss, None where not run yet; chosen: the
    rate the arm's own sweep gives its seeds, or what that waits for (a point whose record must be measured again).
    """

    experiment: str
    arm: str
    losses: dict[float, float | None]
    chosen: float | Waiting

    @property
    def known(self) -> dict[float, float]:
        return {lr: loss for lr, loss in self.losses.items() if loss is not None}

    @property
    def best(self) -> float | None:
        """The rate with the lowest loss so far."""
        known = self.known
        return min(known, key=known.get, default=None)

    @property
    def complete(self) -> bool:
        return None not in self.losses.values()


@dataclass(frozen=True)
class SharedRate:
    """Which compared arms of a sweep share a rate, decided once every arm's seeds at its best rate are measured.

    rates: arm -> the rate it shares with the arm it is compared with (pair_rates; an arm absent keeps its own
    best); spreads: arm -> the standard deviation of its seeds' losses at its best rate; read: the sweep's losses
    the decision read (arm -> "rate" -> loss), so that a sweep trained again decides again.
    """

    rates: dict[str, float]
    spreads: dict[str, float]
    read: dict[str, dict[str, float]]

    def to_json(self) -> dict:
        return {"rates": self.rates, "spreads": self.spreads, "sweep": self.read}

    @classmethod
    def from_json(cls, data: dict) -> SharedRate:
        """A recorded decision; one recorded as a single rate for every arm ({"lr": ...}, the rule before rates
        were shared per compared pair) reads as that rate for each arm it measured."""
        rates = data["rates"] if "rates" in data else (
            {} if data["lr"] is None else dict.fromkeys(data["spreads"], data["lr"]))
        return cls(rates, data["spreads"], data["sweep"])


def as_read(losses: dict[str, dict[float, float]]) -> dict[str, dict[str, float]]:
    """Every arm's sweep losses as a decision records what it read (rates as JSON keys)."""
    return {label: {f"{lr:g}": loss for lr, loss in by_lr.items()} for label, by_lr in losses.items()}


def sweep_rates(lrs: list[float], loss, extend: bool = True) -> list[float]:
    """The rates an arm's sweep tries, in increasing order: the grid, then past a winning edge.

    While the best of them lies at an edge, the grid's next step beyond that edge is added (at most
    SWEEP_EXTENSIONS; none for a grid of under 3 rates, or unless extend): the optimum may lie further on.
    loss(lr): the validation loss at lr, None while not known (the sweep then goes no further).
    """
    rates = sorted(lrs)
    if len(rates) < 3 or not extend:
        return rates
    ratio = (rates[-1] / rates[0]) ** (1 / (len(rates) - 1))  # the grid's step: 2 for sweep_around's
    for _ in range(SWEEP_EXTENSIONS):
        losses = [loss(lr) for lr in rates]
        if None in losses or losses.index(min(losses)) not in (0, len(rates) - 1):
            break
        low = losses.index(min(losses)) == 0
        beyond = float(f"{rates[0] / ratio if low else rates[-1] * ratio:.2g}")  # a rate as one would write it
        rates = [beyond, *rates] if low else [*rates, beyond]
    return rates


def tied_rates(losses: dict[float, float], spread: float) -> set[float]:
    """The rates a sweep cannot tell from its best: a loss less than the seed-to-seed spread above the best's."""
    best = min(losses.values())
    return {lr for lr, loss in losses.items() if loss - best < spread or loss == best}


def pair_rates(losses: dict[str, dict[float, float]], spreads: dict[str, float], pairs: list[tuple[str, str]]
               ) -> dict[str, float]:
    """The rate each compared arm shares with the arm it is compared with, where their sweeps cannot separate rates.

    For each pair in turn, a rate that both arms' sweeps cannot tell from their bests (tied_rates), so that neither
    gains from a choice that is chance; of several, the one whose losses lie least above the pair's bests. An arm
    trains at one rate: once it shares one with an earlier pair, a later pair shares that rate or none. Only the
    compared pair counts, so that a third arm's sweep cannot stop two arms from sharing.
    losses: arm -> rate -> its sweep's loss; spreads: arm -> its spread; pairs: (arm, baseline) in the order decided.
    """
    rates: dict[str, float] = {}
    for pair in pairs:
        common = set.intersection(*(tied_rates(losses[arm], spreads[arm]) for arm in pair))
        fixed = {rates[arm] for arm in pair if arm in rates}
        if len(fixed) > 1:
            continue  # each already shares a different rate with another arm
        common &= fixed or common
        if common:
            lr = min(sorted(common), key=lambda lr: sum(losses[arm][lr] - min(losses[arm].values()) for arm in pair))
            rates.update(dict.fromkeys(pair, lr))
    return rates


def sweep_loss(record) -> float:
    """The validation loss a sweep compares rates by, from one run's record.

    Over the whole validation split where the record measured it (val_ppl's val_loss; extrapolation's perplexity
    at the training length), else the training's own validation (a sample of the split).
    """
    details, values = record.details, record.values
    if "val_tokens" in details and "val_loss" in details:
        return details["val_loss"]
    if "ppl_tokens" in details:  # every window of the split at each length: the shortest is the training length
        lengths = [int(key.removeprefix("ppl@")) for key in values if key.startswith("ppl@")]
        return math.log(values[f"ppl@{min(lengths)}"])
    loss = record.extent.get("best_val_loss")
    return math.inf if loss is None else loss  # a run that never validated (it diverged) loses
