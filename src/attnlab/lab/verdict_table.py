"""A report's verdict table: one row per claim, the paper's effect beside ours, and the verdict by RULES."""

from __future__ import annotations

import math

from .claims import ALPHA, CLEARED, MIN_SEEDS, SAME_FRACTION, SAME_NATS, Claim, Verdict, holm_corrected
from .stats import MAX_SEEDS, fewest_seeds


def verdict_table(judged: list[tuple[Claim, Verdict]], planned_seeds=lambda claim: None,
                  caveats=lambda claim: []) -> list[str]:
    """Markdown lines: one row per claim with the paper's effect (and in our units), ours with its 95% interval,
    the verdict by RULES (interim while fewer seeds have values than `planned_seeds(claim)`, with `caveats(claim)`
    about the runs behind it: "*stopped at the cap*, ...") and the power of this run. Headline claims are in bold.
    judged: each claim with its verdict (verdicts.evaluate)."""
    lines = ["| claim | paper | ours (Δ, 95% interval) | verdict | power |", "|---|---|---|---|---|"]
    corrected = holm_corrected(judged)
    family = f"{len(corrected)} tested claim{'s' if len(corrected) > 1 else ''}"
    for i, (claim, v) in enumerate(judged):
        statement = f"**{claim.statement}**" if claim.headline else claim.statement
        adjusted = corrected.get(i)
        marks = _marks(claim, v, planned_seeds(claim), caveats, adjusted, family)
        holm_p = "" if adjusted is None else f"; p = {v.p:.2g}, Holm over {family}: {adjusted:.2g}"
        ours = _ours_cell(claim, v) + holm_p + _sign_flip_cell(claim, v) + _tokens_cell(claim, v)
        cells = [f"{statement}{_scale_note(claim, v)} ({_what(claim)})", _paper_cell(claim, v), ours,
                 f"**{v.verdict}**{''.join(f' ({m})' for m in marks)}: {v.reason}", _power_cell(claim, v)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _marks(claim: Claim, v: Verdict, planned: int | None, caveats, adjusted: float | None, family: str) -> list[str]:
    """What the verdict word needs beside it: interim, the runs' caveats, Holm's correction (the claim's adjusted
    p-value over the suite's `family` of tested claims), too few seeds for the sign-flip test, fragility, the other
    transfer assumption, a control arm."""
    # a missed calibration is the baseline's, whose seeds the calibration lines give: nothing left to come
    judged = v.n > 0 and v.verdict != "not calibrated"
    marks = [f"*interim*, {v.n} of {planned} planned seeds"] if judged and planned and v.n < planned else []
    marks += caveats(claim) if judged else []
    if judged and v.verdict in CLEARED and adjusted is not None and adjusted >= ALPHA:
        marks.append(f"*not significant after Holm's correction* over the {family}: adjusted p = {adjusted:.2g}")
    if judged and claim.headline and not math.isnan(v.sign_flip) and v.n < fewest_seeds(ALPHA):
        marks.append(f"*few seeds*: with {v.n}, the sign-flip test cannot go below p = {2 / 2**v.n:.2g}")
    if judged and v.verdict in CLEARED and claim.direction != "equal" and v.fragile:
        marks.append(f"*fragile*: the interval clears 0 by {min(abs(v.low), abs(v.high)):.2g}, under a fifth of "
                     f"its half-width {(v.high - v.low) / 2:.2g}")
    if judged and v.other is not None:
        marks.append(f"*the transfer assumptions differ*: under {SAME_FRACTION}, **{v.other[0]}**"
                     if v.other[0] != v.verdict else "the same under both transfer assumptions")
    if judged and v.rerun is not None:
        again = v.rerun
        marks.append(("*the protocol decides*: " if again.verdict != v.verdict else "")
                     + f"on {claim.rerun}, {_ours_cell(claim, again)}, **{again.verdict}**: {again.reason}")
    if claim.control_arm is not None:
        marks.append(f"{claim.arm} is a control: {claim.control_arm}, so it has no component of its own and "
                     f"no result of the mechanism's can fail this claim")
    return marks


def _what(claim: Claim) -> str:
    """What Δ is, in words: "Δ = hJ − softmax in val_ppl on lm"."""
    if claim.baseline is None:
        delta = claim.arm
    else:
        delta = f"{claim.arm} / {claim.baseline} − 1" if claim.relative else f"{claim.arm} − {claim.baseline}"
    if claim.scale != 1:
        delta = f"{claim.scale:g} × ({delta})"
    if claim.baseline is None and claim.reference:
        delta = f"{delta} − {claim.reference:g}"
    where = f"on {claim.experiment}" + (f" minus the same on {claim.contrast}" if claim.contrast else "")
    return f"Δ = {delta} in {claim.metric} {where}"


def _paper_cell(claim: Claim, v: Verdict) -> str:
    """The paper's effect (an equal claim: the margin, and the paper's own Δ) as the paper gives it and, for a
    per-token claim, per character under each transfer assumption."""
    equal = claim.direction == "equal"
    if claim.paper is None and not equal:
        return "–"
    number = (lambda x: f"±{claim.signed(x).lstrip('+')}") if equal else claim.signed
    given = claim.margin if equal else claim.paper
    own = f" (the paper's Δ: {claim.signed(claim.paper)})" if equal and claim.paper is not None else ""
    if claim.chars_per_token is None:
        return ("within " if equal else "") + number(given) + own
    ours = claim.threshold if equal else claim.target
    cell = (f"{'within ' if equal else ''}{number(given)} per token{own} → **{number(ours)} per character** "
            f"({SAME_NATS}, {claim.chars_per_token:g} characters per token)")
    if v.other is not None:
        cell += f"; {number(v.other[1])} ({SAME_FRACTION})"
    return cell


def _ours_cell(claim: Claim, v: Verdict) -> str:
    if v.n == 0:
        return "no values"
    half = (v.high - v.low) / 2
    if not half > 0:  # one seed, or no spread
        return f"{claim.signed(v.delta)} ({v.n} seed{'s' if v.n > 1 else ''})"
    decimals = max(0, 1 - math.floor(math.log10(half)))  # two significant digits of the half-width

    def num(x: float) -> str:
        return f"{x:+,.{decimals}f}{claim.units}"

    return f"{num(v.delta)} [{num(v.low)}, {num(v.high)}]"


def _sign_flip_cell(claim: Claim, v: Verdict) -> str:
    """A directional headline's exact sign-flip p-value, beside its t-interval."""
    return "" if not claim.headline or math.isnan(v.sign_flip) else f"; sign-flip p = {v.sign_flip:.2g}"


def _tokens_cell(claim: Claim, v: Verdict) -> str:
    """The interval over the validation tokens alone, beside the seed interval (a headline's says where the
    records cannot give it)."""
    tokens = v.tokens
    if tokens is None or (tokens.interval is None and not claim.headline):
        return ""
    if tokens.interval is None:
        kept = f"{tokens.seeds} of {tokens.paired} seeds keep them, {MIN_SEEDS} needed" if tokens.seeds else \
            "these records keep no per-block losses"
        return f"; the validation tokens alone: not measured ({kept})"
    over = "" if tokens.seeds == tokens.paired else f" over the {tokens.seeds} of {tokens.paired} seeds that keep them"
    low, high = tokens.interval
    return f"; the validation tokens alone (a paired bootstrap of {tokens.blocks} blocks{over}): " \
           f"[{claim.signed(low)}, {claim.signed(high)}]"


def _power_cell(claim: Claim, v: Verdict) -> str:
    if v.n < 2:
        return "–"
    if v.n < MIN_SEEDS:
        return f"unknown: {v.n} seeds (the spread of {v.n} has {v.n - 1} degree of freedom)"
    if math.isnan(v.detectable):
        return f"unknown: no spread (n = {v.n})"
    if claim.largest is not None and v.detectable > claim.largest:  # not "detects ≥ 540" on a 100-point scale
        cell = f"no effect the metric can show (≥ {v.detectable:.2g} needed, n = {v.n})"
    else:
        cell = f"detects ≥ {v.detectable:.2g}{claim.units} (n = {v.n})"
    if v.seeds_needed is not None:
        target = "the margin" if claim.direction == "equal" else "the paper's effect"
        count = f"more than {MAX_SEEDS:,}" if v.seeds_needed > MAX_SEEDS else f"{v.seeds_needed:,}"
        cell += f"; {target} needs {count} seeds"
    return cell


def _scale_note(claim: Claim, v: Verdict) -> str:
    """" (the paper: 60M; here: 0.8M)" where the claim names the paper's model size."""
    if claim.paper_scale is None:
        return ""
    here = "not run yet" if v.params is None else f"{v.params / 1e6:.2g}M"
    return f" (the paper: {claim.paper_scale}; here: {here})"
