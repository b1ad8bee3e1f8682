"""A simulated long run at scale (`python -m resilient_slurm.simulate`), decided by the project's own code.

Modules, from inputs to the report:
    failures   the fault catalog (published shares, what each leaves behind), the mix    [pure]
    scenario   the run's inputs with their defaults, the strategies compared             [pure]
    costs      what getting back to training costs: scheduler, queue, start, load        [pure]
    history    the ledger the decisions read, kept to the window that decides            [pure]
    tiers      which checkpoints a restart can read: hot tier, or cold copies finished    [pure]
    engine     the event loop: failures, saves, restarts, each decided by the project    [pure]
    results    one seed in GPU-hours and dollars; mean and percentiles over seeds         [pure]
    report     the tables and the JSON object                                             [pure]
    plot       a PNG timeline of one seed (matplotlib, imported lazily)
    __main__   the command line; --from-bench reads measured costs
"""
