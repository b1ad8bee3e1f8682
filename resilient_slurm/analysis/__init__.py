"""After (and during) a run: what its ledger, metrics and record add up to. Readers only: what a run
writes is written through `rundir/`.

Modules, from what a run writes to what a user reads:
    goodput   ledger + metrics → attempts, restarts by cause, time accounting, goodput    [pure]
    faults    the hangs (with the ranks the others waited for) and stragglers (with their swap's
              effect on throughput) of a run                                           [pure]
    rank_ends which rank ended an attempt and how (a signal, the OOM killer, a crash)   [pure]
    summary   a run directory read into a Summary
    report    `python -m resilient_slurm.report`: the summary as text, one run or several
    plot      report.png: loss curve with faults marked over a timeline (matplotlib, lazily)
    compare   `python -m resilient_slurm.compare`: differing keys, ablation check, metric deltas
"""
