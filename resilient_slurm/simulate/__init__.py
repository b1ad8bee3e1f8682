"""A simulated long run at scale (`python -m resilient_slurm.simulate`), decided by the project's own code.

Modules, from inputs to the report:
    failures   the fault catalog (published shares, what each leaves behind), the mix    [pure]
    bench      the keys read from the benches' JSON, and the scenario fields they make    [pure]
    scaling    measured costs scaled to the target's model and hardware (--scale-to)      [pure]
    published  what a CPU cannot measure: communicator creation at scale, SDC and fail-slow
               rates, replica-group costs, each with its source                          [pure]
    scenario   the run's inputs with their defaults and sources, the strategies compared  [pure]
    costs      what getting back to training costs: scheduler, queue, start, load, and an
               in-process restart broken down as its restart event records it            [pure]
    history    the ledger the decisions read, kept to the window that decides            [pure]
    tiers      which checkpoints a restart can read: hot tier, or cold copies finished    [pure]
    memory     the memory tier: saves to host memory with a buddy copy, what survives    [pure]
    saving     the run's saves: disk (sync, async) and memory tier, when due, what they block [pure]
    partial    what stops or slows part of the run: replica groups that leave and heal, silent
               data corruption, stragglers                                                [pure]
    engine     the event loop: failures, saves, restarts, each decided by the project    [pure]
    results    one seed in GPU-hours and dollars; mean and percentiles over seeds         [pure]
    report     the tables (one strategy, the strategies, the losses step by step)         [pure]
    plot       a PNG timeline of one seed (matplotlib, imported lazily)
    __main__   the command line; --from-bench reads measured costs, --scale-to scales them
"""
