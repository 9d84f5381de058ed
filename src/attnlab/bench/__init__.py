"""``attnlab bench``: speed measured side by side in one run, with the goals each result is held to.

One module per view: `mixers` (each mixer alone, decode latency), `forms` (op forms against their references and
peers), `models` (training steps), `packed` (packed documents), `utilisation` (matmul peak against a training
step); the instruments they share (`instruments`: matmul peaks, FLOPs, memory); and `whole`, which runs them all
with the papers' own cases from `registry`. Importing the package imports nothing heavy: the papers register into
`registry` when they load.
"""
