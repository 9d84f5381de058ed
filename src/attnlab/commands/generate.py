"""attnlab generate: text sampled from a run."""

from __future__ import annotations

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
