"""Corpora, tokenizers and synthetic tasks (a registry: `tasks`), behind one entry point: `load_data`.

Every data source offers ``batch(split, batch_size, seq_len, generator) -> (inputs, targets)`` (targets
of -100 are not scored), ``vocab_size``, ``tokenizer`` and ``describe()``; tasks with a pointer head
also set ``output_size``. Text corpora also serve whole documents packed into rows, with their boundaries:
``packed_batch`` for training and ``packed_split`` for evaluation.
"""

from __future__ import annotations

from . import brackets, mqar, niah, state_tracking  # noqa: F401  (the built-in tasks, registered on import)
from .corpus import TokenCorpus, load_corpus
from .tasks import TASKS, Floor, NoOptions, Task, register_task
from .tokenizer import ByteTokenizer, CharTokenizer, tokenizer_from_dict

__all__ = ["TASKS", "ByteTokenizer", "CharTokenizer", "Floor", "NoOptions", "Task", "TokenCorpus", "load_corpus",
           "load_data", "register_task", "tokenizer_from_dict"]


def load_data(cfg, seq_len: int, tokenizer=None):
    """The data source named by cfg.source (a DataConfig), for sequences of seq_len tokens: a registered task's
    examples, made from its typed settings, or a text corpus, read with `tokenizer` where given (a trained model's)
    instead of one fitted to it."""
    if cfg.source in TASKS:
        return TASKS[cfg.source].load(cfg.task_config(), seq_len)
    return load_corpus(cfg, tokenizer)
