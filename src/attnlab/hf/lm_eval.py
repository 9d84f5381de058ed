"""lm-evaluation-harness on attnlab runs: the model type ``attnlab`` (``path=`` a run or checkpoint folder).

    attnlab eval runs/<name> --lm-eval TASK ...                     # the shortcut
    python -m attnlab.hf.lm_eval run --model attnlab --model_args path=runs/<name> --tasks TASK ...

(lm-eval's own command finds only its built-in model types; the module form registers this one first.)

Scores are attnlab's own: the log-probabilities come from the run's Decoder and tokenizer, in windows of
its training length, as its evaluation reads them. The first token of a text is conditioned on a newline,
the document boundary of attnlab's text corpora; lm-eval needs such a token, and these vocabularies have
no end-of-text token.
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..inference import load_run

MISSING = "attnlab.hf.lm_eval needs lm-evaluation-harness: pip install 'attnlab[eval]'"

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ModuleNotFoundError as err:
    if (err.name or "").split(".")[0] != "lm_eval":  # lm-eval is there, and what it lacks its error says
        raise
    if __name__ == "__main__":  # python -m attnlab.hf.lm_eval: the command line's one line and exit code
        print(f"error: {MISSING}", file=sys.stderr)
        raise SystemExit(2) from None
    raise UserError(MISSING) from None

log = logging.getLogger(__name__)


@register_model("attnlab")
class AttnlabLM(TemplateLM):
    def __init__(self, path: str, device: str | None = "auto", max_length: int | None = None,
                 batch_size: int | str = 1, **kwargs):
        """batch_size: the requests one forward reads, laid end to end in one packed row, each from its own
        fresh state; "auto" takes AUTO_BATCH. Other kwargs: lm-eval's, unused."""
        super().__init__()
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's command line asks for cuda:0 unless told otherwise
            log.warning("device=%s is not available here; running on the CPU", device)
            device = "cpu"
        self.run = load_run(path, device=device or "auto")
        self.max_length = int(max_length or self.run.config.train.seq_len)
        self.batch_size = _batch_size(batch_size)

    @property
    def eot_token_id(self) -> int:
        try:
            (newline,) = self.run.tokenizer.encode("\n")
        except (UserError, ValueError):
            raise UserError(f"{self.run.folder}'s vocabulary has no single newline token to start a text from; "
                            "lm-eval's empty contexts and rolling log-likelihoods need one") from None
        return int(newline)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.run.tokenizer.encode(string).tolist()

    def tok_decode(self, tokens) -> str:
        return self.run.tokenizer.decode(tokens)

    @torch.inference_mode()
    def _scores(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """For each (context, continuation): the continuation's summed log-probability after (the end of) the
        context, and whether greedy decoding would have produced it. At most max_length tokens are read, cut
        from the left; batch_size pairs at a time go through the model as one packed row."""
        windows = []
        for context, continuation in pairs:
            if len(continuation) > self.max_length:
                raise UserError(f"a continuation of {len(continuation)} tokens does not fit the model's context of "
                                f"{self.max_length}; pass a larger max_length in --model_args, or leave this task out")
            windows.append(((context + continuation)[-(self.max_length + 1):], continuation))
        results = []
        for batch in _chunks(windows, self.batch_size):
            inputs = [torch.as_tensor(window[:-1]) for window, _ in batch]
            cu_seqlens = F.pad(torch.tensor([len(i) for i in inputs]).cumsum(0), (1, 0)).to(self.run.device)
            logits, _ = self.run.model(torch.cat(inputs).to(self.run.device)[None], cu_seqlens=cu_seqlens,
                                       keep_states=False)
            log_probs = F.log_softmax(logits[0].float(), dim=-1)
            for end, (_, continuation) in zip(cu_seqlens[1:].tolist(), batch, strict=True):
                scored = log_probs[end - len(continuation) : end]
                targets = torch.as_tensor(continuation, device=scored.device)
                total = scored.gather(1, targets[:, None]).sum()
                results.append((float(total), bool((scored.argmax(-1) == targets).all())))
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self._scores([(context, continuation) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The whole text's log-likelihood, in disjoint windows of max_length tokens."""
        texts = [list(get_rolling_token_windows(self.tok_encode(text), self.eot_token_id, self.max_length, 1))
                 for (text,) in (request.args for request in requests)]
        scores = iter(self._scores([make_disjoint_window(w) for windows in texts for w in windows]))
        return [sum(next(scores)[0] for _ in windows) for windows in texts]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with do_sample and temperature) continuations, cut at the first stop string.
        Prompts whose continuation fits the model's window are generated batch_size at a time, padded on the
        left (each row as it would be alone); longer ones alone, through a sliding view of max_length tokens."""
        jobs = [_generation(context, dict(options), self.tok_encode) for context, options in
                (request.args for request in requests)]
        groups: dict[tuple, list[int]] = {}
        for i, (prompt, tokens, temperature, _) in enumerate(jobs):
            fits = len(prompt) + tokens <= self.max_length + 1  # the sliding view would never move
            groups.setdefault((tokens, temperature) if fits else (tokens, temperature, i), []).append(i)
        texts: dict[int, str] = {}
        for (tokens, temperature, *alone), members in groups.items():
            for batch in _chunks(members, 1 if alone else self.batch_size):
                prompts = [jobs[i][0] for i in batch]
                for i, new in zip(batch, self._generate(prompts, tokens, temperature, bool(alone)), strict=True):
                    text = self.tok_decode(new)
                    for stop in jobs[i][3]:
                        text = text.split(stop)[0]
                    texts[i] = text
        return [texts[i] for i in range(len(jobs))]

    def _generate(self, prompts: list[list[int]], tokens: int, temperature: float, sliding: bool) -> list[list[int]]:
        """The new tokens of each prompt, the prompts left-padded into one batch."""
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.run.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.run.device)
        out = self.run.model.generate(ids, tokens, temperature=temperature, attention_mask=mask,
                                      context=self.max_length if sliding else None)
        return out[:, width:].tolist()


AUTO_BATCH = 32  # requests per packed forward under batch_size=auto


def _batch_size(value: int | str) -> int:
    """lm-eval's batch_size (an int, or "auto" with an optional ":N") as requests per forward."""
    if str(value).startswith("auto"):
        return AUTO_BATCH
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise UserError(f"batch_size={value} must be a whole number of requests, 1 or more, or auto")
    return size


def _generation(context: str, options: dict, encode) -> tuple[list[int], int, float, list[str]]:
    """A generate_until request as (prompt tokens, tokens to generate, temperature, stop strings)."""
    until = options.pop("until", None) or []
    tokens = options.pop("max_gen_toks", 256)
    temperature = options.pop("temperature", 0.0) if options.pop("do_sample", False) else 0.0
    return encode(context), tokens, temperature, [until] if isinstance(until, str) else until


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
