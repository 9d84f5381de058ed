"""attnlab generate: text sampled from a run, printed as it is sampled."""

from __future__ import annotations

import sys
import time

from ..arguments import RUN, context_size, non_empty, positive_float, positive_int, probability, seed_value, temperature
from ..errors import UserError


def add_parser(sub) -> None:
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
    p.set_defaults(func=main)


def main(args) -> None:
    from ..inference import load_run

    run = load_run(args.checkpoint)
    prompt = _check_prompt(run, args.prompt)
    _check_reach(run, prompt, args.tokens, args.context)
    context = -1 if args.context is None else (args.context or None)
    printer = Printer(args.samples, args.tokens)
    try:
        run.complete(prompt, args.tokens, args.temperature, args.top_k, args.seed, context, top_p=args.top_p,
                     repetition_penalty=args.repetition_penalty, stop=args.stop, num_samples=args.samples,
                     on_text=printer.add)
    finally:  # interrupted (Ctrl-C) too: the text sampled so far is printed, and the CLI says it was interrupted
        printer.finish()


LONG_SECONDS = 60.0  # a generation estimated to take longer says so first: past a minute one wonders whether it runs
PROBE_TOKENS, PROBE_SECONDS = 32, 1.0  # the speed is measured over this many tokens, or this long if sooner


class Printer:
    """Prints the samples as they are sampled: the first as its tokens come, each piece flushed (to a terminal or
    a pipe alike), the others, sampled alongside it in one batch, once it ends. Before any text, a long --tokens
    says what it will cost, at the speed measured over its first tokens."""

    def __init__(self, samples: int, tokens: int):
        self.texts = [""] * samples  # what each sample has that is not printed yet
        self.tokens = tokens
        self.calls = 0  # the prompt's, then one per token
        self.first_token_at: float | None = None
        self.streaming = False

    def add(self, pieces: list[str]) -> None:
        for i, piece in enumerate(pieces):
            self.texts[i] += piece
        self.calls += 1
        if not self.streaming:
            self._measure()
        if self.streaming:
            self._write(self.texts[0])
            self.texts[0] = ""

    def _measure(self) -> None:
        """Start streaming once the speed is known, saying first what the rest will cost if that is long."""
        done, now = self.calls - 1, time.perf_counter()
        if done == 1:
            self.first_token_at = now  # after the prefill: the time per token is measured from here
        if done < 2 or (done - 1 < PROBE_TOKENS and now - self.first_token_at < PROBE_SECONDS and done < self.tokens):
            return
        rate = (done - 1) / max(now - self.first_token_at, 1e-9)
        remaining = (self.tokens - done) / rate
        if remaining > LONG_SECONDS:
            print(f"--tokens {self.tokens}: up to about {_duration(remaining)} more at the {rate:.3g} tokens/s "
                  "measured; Ctrl-C stops it and prints the text so far", file=sys.stderr, flush=True)
        self._start()

    def _start(self) -> None:
        self.streaming = True
        if len(self.texts) > 1:
            self._write(f"--- sample 1 of {len(self.texts)} ---\n")

    def finish(self) -> None:
        """The rest of the first sample and every other sample, each ending its line."""
        if not self.streaming:
            self._start()
        self._write(self.texts[0] + "\n")
        for i, text in enumerate(self.texts[1:], 2):
            self._write(f"--- sample {i} of {len(self.texts)} ---\n{text}\n")
        self.texts = [""] * len(self.texts)

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.2g} {unit}"
    return f"{seconds:.0f} s"


def _check_reach(run, prompt: str, tokens: int, context: int | None) -> None:
    """A UserError, before any work, where --tokens (or --context) would have the model read more tokens at once
    than it can (Decoder.read_limit: learned positions, a mixer's window); its last token is sampled, not read."""
    limit = run.model.read_limit()
    if limit is None:
        return
    most, why = limit
    n = len(run.tokenizer.encode(prompt))
    view = run.config.train.seq_len if context is None else (context or None)  # None: unbounded
    reach = n + max(tokens - 1, 0)
    if min(reach, view or reach) <= most:
        return
    if view:
        raise UserError(f"--context {view} lets the model read {min(reach, view)} tokens at once, beyond the {most} "
                        f"it can ({why}); give --context {most} or less")
    fewer = f"--tokens {most - n + 1} or less, or " if n <= most else ""
    raise UserError(f"--tokens {tokens} after a prompt of {n} tokens would have the model read {reach} at once under "
                    f"--context 0 (unbounded), beyond the {most} it can ({why}); give {fewer}--context {most} or less "
                    "(the view re-reads its newest half when full)")


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
