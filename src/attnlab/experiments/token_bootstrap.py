"""A relative perplexity claim's 95% interval over the validation tokens alone: a paired bootstrap of blocks."""

from __future__ import annotations

from dataclasses import dataclass

from .claims import MIN_SEEDS, Claim, seeds_of
from .store import Results, RunKey

BOOTSTRAP_DRAWS = 2000


@dataclass(frozen=True)
class TokenInterval:
    """What token_interval found: the interval, and the blocks and seeds it resampled."""

    interval: tuple[float, float] | None  # None: fewer than MIN_SEEDS seeds keep their blocks
    blocks: int
    seeds: int  # the paired seeds whose records keep their blocks
    paired: int  # the paired seeds in all


def token_interval(claim: Claim, results: Results, draws: int = BOOTSTRAP_DRAWS) -> TokenInterval | None:
    """The 95% interval of a relative perplexity claim's mean Δ over the validation tokens alone: the same models,
    the split's blocks of windows (runner records val_blocks) resampled with replacement, the same draw for both
    arms and every seed (paired), over the paired seeds whose records keep their blocks (at least MIN_SEEDS).
    Beside the seed interval it says how much of the uncertainty is the validation sample's. None where the claim
    is not one of them; an interval of None where too few seeds keep blocks."""
    if claim.metric != "val_ppl" or not claim.relative or claim.contrast or claim.baseline is None:
        return None
    import numpy as np  # when an interval is computed: importing the report stays light

    arms, bases, paired = [], [], 0
    for seed in seeds_of(results, [claim.experiment]):
        arm, base = (results.get(RunKey(claim.experiment, label, seed=seed)) for label in (claim.arm, claim.baseline))
        if arm is None or base is None or "val_ppl" not in arm.values or "val_ppl" not in base.values:
            continue  # as paired_deltas: a seed without both values is left out
        paired += 1
        if "val_blocks" in arm.details and "val_blocks" in base.details:
            arms.append(arm.details["val_blocks"])
            bases.append(base.details["val_blocks"])
    if len(arms) < MIN_SEEDS:
        return TokenInterval(None, 0, len(arms), paired)
    arm_blocks, base_blocks = np.array(arms), np.array(bases)  # [seeds, blocks]
    picks = np.random.default_rng(0).integers(0, arm_blocks.shape[1], size=(draws, arm_blocks.shape[1]))
    gap = arm_blocks[:, picks].mean(-1) - base_blocks[:, picks].mean(-1)  # [seeds, draws]: loss per token, arm - base
    deltas = (100 * np.expm1(gap)).mean(0)
    low, high = np.percentile(deltas, [2.5, 97.5])
    return TokenInterval((float(low), float(high)), arm_blocks.shape[1], len(arms), paired)
