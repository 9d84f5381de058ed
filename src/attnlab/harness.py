"""lm-evaluation-harness on attnlab runs: the model type ``attnlab`` (``path=`` a run or checkpoint folder).

    attnlab eval runs/<name> --lm-eval TASK ...                     # the shortcut
    python -m attnlab.harness run --model attnlab --model_args path=runs/<name> --tasks TASK ...

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

from .errors import UserError
from .inference import load_run

MISSING = "attnlab.harness needs lm-evaluation-harness: pip install 'attnlab[eval]'"

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ModuleNotFoundError as err:
    if (err.name or "").split(".")[0] != "lm_eval":  # lm-eval is there, and what it lacks its error says
        raise
    if __name__ == "__main__":  # python -m attnlab.harness: the command line's one line and exit code
        print(f"error: {MISSING}", file=sys.stderr)
        raise SystemExit(2) from None
    raise UserError(MISSING) from None

log = logging.getLogger(__name__)


@register_model("attnlab")
class AttnlabLM(TemplateLM):
    def __init__(self, path: str, device: str | None = "auto", max_length: int | None = None, **kwargs):
        """kwargs: lm-eval's batch settings, unused (one sequence per forward)."""
        super().__init__()
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's command line asks for cuda:0 unless told otherwise
            log.warning("device=%s is not available here; running on the CPU", device)
            device = "cpu"
        self.run = load_run(path, device=device or "auto")
        self.max_length = int(max_length or self.run.config.train.seq_len)

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
    def _log_probs(self, tokens: list[int]) -> torch.Tensor:
        """log p(tokens[i + 1] | tokens[:i + 1]) for every i, as a [len - 1, vocab] tensor."""
        ids = torch.as_tensor(tokens, device=self.run.device)[None]
        logits, _ = self.run.model(ids[:, :-1])
        return F.log_softmax(logits[0].float(), dim=-1)

    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Summed log-probability of the continuation after (the end of) the context, and whether greedy
        decoding would have produced it. At most max_length tokens are read, cut from the left."""
        if len(continuation) > self.max_length:
            raise UserError(f"a continuation of {len(continuation)} tokens does not fit the model's context of "
                            f"{self.max_length}; pass a larger max_length in --model_args, or leave this task out")
        tokens = (context + continuation)[-(self.max_length + 1):]
        log_probs = self._log_probs(tokens)[-len(continuation):]
        targets = torch.as_tensor(continuation, device=log_probs.device)
        total = log_probs.gather(1, targets[:, None]).sum()
        return float(total), bool((log_probs.argmax(-1) == targets).all())

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return [self._score(context, continuation) for _, context, continuation in requests]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The whole text's log-likelihood, in disjoint windows of max_length tokens."""
        results = []
        for (text,) in (request.args for request in requests):
            windows = get_rolling_token_windows(self.tok_encode(text), self.eot_token_id, self.max_length, 1)
            results.append(sum(self._score(*make_disjoint_window(w))[0] for w in windows))
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with do_sample and temperature) continuations, cut at the first stop string."""
        outputs = []
        for context, options in (request.args for request in requests):
            options = dict(options)
            until = options.pop("until", None) or []
            until = [until] if isinstance(until, str) else until
            tokens = options.pop("max_gen_toks", 256)
            temperature = options.pop("temperature", 0.0) if options.pop("do_sample", False) else 0.0
            prompt = torch.as_tensor(self.tok_encode(context), device=self.run.device)[None]
            out = self.run.model.generate(prompt, tokens, temperature=temperature, context=self.max_length)
            text = self.tok_decode(out[0, prompt.shape[1]:].tolist())
            for stop in until:
                text = text.split(stop)[0]
            outputs.append(text)
        return outputs


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
