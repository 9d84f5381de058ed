"""The lab: plans a suite's runs, trains and measures them anywhere, and judges the papers' claims in a report.

What a suite declares (`spec`), the plan of its jobs and the decisions behind them (`plan`, `sweeps`, `configs`),
the driver and its executors (`driver`, `job`, `executors`), the records (`store`), the verdicts (`claims`,
`verdicts`) and the report (`report` and its sections), beside the lab's instruments (`doctor`). The papers
themselves live in `attnlab.papers`; the lab imports none of them.
"""
