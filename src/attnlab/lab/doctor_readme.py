"""A doctor run as the results README tells it, from its doctor.json alone.

Where it ran, the mixers within the limits, the demo model, each mixer's forward+backward at every timed length,
the fused backends against the torch forms and the goals. Plain text from plain data: `attnlab results` writes
it without importing torch.
"""

from __future__ import annotations


def readme_section(report: dict) -> str:
    """The README's account of a doctor run on a GPU: where it ran, the mixers within limits, the demo model,
    each mixer's forward+backward at every timed length (and the fused backends' against the torch forms), and
    the goals."""
    speed = _speed_by_length(report)
    return "\n".join([_summary(report, speed), *_speed_table(speed), *_fused_table(report), *_goals(report)])


def value_text(value) -> str:
    """A goal's measured value as the tables show it: three significant digits, or - where none was measured."""
    return "-" if value is None else f"{value:.3g}"


def _summary(report: dict, speed: dict) -> str:
    """The opening paragraph: the machine, the mixers' errors, the demo model's throughput, what is missing."""
    env = report["environment"]
    errors = {p: [row[p][k] for row in report["mixers"].values() if "error" not in row
                  for k in ("forward", "gradient", "decode")] for p in ("fp32", "bf16")}
    within = len(report["mixers"]) - len(report["failed"])
    text = (f"The last run, on one {env.get('gpu', env['device'])} (PyTorch {env['torch'].split('+')[0]}, "
            f"CUDA {env.get('cuda_version')}, Triton {env.get('triton')}), is in "
            f"[`results/doctor/`](results/doctor/): {within} of {len(report['mixers'])} mixers within the limits "
            f"(fp32 relative errors {_short(min(errors['fp32']))} to {_short(max(errors['fp32']))} against fp64, "
            f"bf16 {_short(min(errors['bf16']))} to {_short(max(errors['bf16']))})")
    if "train" in report:
        train = report["train"]
        text += (f", the demo model at {train['tokens_per_s'] / 1e3:.0f}K tokens/s ({train['steps']} steps in "
                 f"{train['seconds']:.0f} s, validation loss {train['val_loss']:.2f})")
    compiled = report.get("compile", {})
    if compiled and "error" not in compiled:
        text += (f", compiled (train.compile) at {compiled['tokens_per_s'] / 1e3:.0f}K tokens/s after "
                 f"{compiled['warmup_s']:.0f} s of compile warm-up")
    packing = report.get("packing", {})
    if packing and "error" not in packing:
        text += (", and " + ", ".join(f"{k} at once {row['tokens_per_s'] / 1e3:.0f}K tokens/s in all "
                                      f"({row['x_one']:.2f}x one)" for k, row in packing.items() if k != "1"))
    text += "." if speed else "; no timings."
    if env.get("fla") is None:
        text += (" fla was not installed in this run: its kernels are neither checked nor timed here, and "
                 "`backend=auto` ran every mixer on its torch form.")
    return text


def _speed_table(speed: dict) -> list[str]:
    """Each mixer's forward+backward milliseconds and ratio to softmax, a pair of columns per timed length."""
    if not speed:
        return []
    lengths = list(speed)
    header = " | ".join(f"T {n} ms | × softmax" for n in lengths)
    lines = ["", f"| mixer (fwd+bwd, bf16, batch 8, d_model 512) | {header} |",
             "| --- |" + " ---: | ---: |" * len(lengths)]
    for label in speed[lengths[0]]:
        cells = " | ".join(f"{speed[n][label]['ms']:.2f} | {speed[n][label]['x_softmax']:.2f}"
                           if label in speed[n] else "– | –" for n in lengths)
        lines.append(f"| {label} | {cells} |")
    return lines


def _fused_table(report: dict) -> list[str]:
    """Each fused backend's difference from the torch form and both times, or why the run has none."""
    rows = [(n, label, row) for n, compared in report.get("fused", {}).items() for label, row in compared.items()]
    if rows:
        return ["", "| fused backend against the torch form | T | relative difference | torch ms | fused ms |",
                "| --- | ---: | ---: | ---: | ---: |",
                *(f"| {label} | {n} | " + (f"{row['difference']:.1g} | {row['torch_ms']:.2f} | {row['fused_ms']:.2f} |"
                                           if "error" not in row else f"failed: {row['error'][:80]} | | |")
                  for n, label, row in rows)]
    if "speed" in report:
        return ["", "The fused backends' section did not finish in this run (fla compiles and tunes its kernels "
                    "on first use): no timings of them."]
    return []


def _goals(report: dict) -> list[str]:
    """How many goals got each verdict, then every goal not met, one a line."""
    if "goals" not in report:
        return ["", "This run predates the doctor's goals: none judged."]
    verdicts = [goal["verdict"] for goal in report["goals"]]
    return ["", "Goals: " + ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts)) + ".",
            *(f"- {goal['goal']}: {value_text(goal['value'])} ({goal['bar']}), {goal['verdict']}"
              for goal in report["goals"] if goal["verdict"] != "met")]


def _short(x: float) -> str:
    """2e-7, 0.004, 1.4e-2 style: two significant digits at most, no padded exponent."""
    return f"{x:.2g}".replace("e-0", "e-")


def _speed_by_length(report: dict) -> dict:
    """{length: {label: {ms, x_softmax}}}; a run written before timings were kept per length timed T = 2048."""
    speed = report.get("speed", {})
    if speed and all("ms" in row for row in speed.values()):
        return {"2048": speed}
    return speed
