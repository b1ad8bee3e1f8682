"""After (and during) a run: its record, its metrics, and what they add up to.

Modules, from what a run writes to what a user reads:
    record    record.jsonl: every launch and attempt (job, nodes, versions, git state and diff)
    metrics   metrics.jsonl (the surviving timeline) and metrics-lost.jsonl (steps redone)
    goodput   ledger + metrics → attempts, restarts by cause, time accounting, goodput    [pure]
    summary   a run directory read into a Summary
    report    `python -m resilient_slurm.report`: the summary as text, one run or several
    plot      report.png: loss curve with faults marked over a timeline (matplotlib, lazily)
    compare   `python -m resilient_slurm.compare`: differing keys, ablation check, metric deltas
"""
