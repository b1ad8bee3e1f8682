"""Process plumbing every side of a run shares (launcher, supervisor, ranks): signals, threads, and
what a supervisor tells a rank it starts.

Modules:
    signals      the only caller of signal.signal: stop signals just record a request
    threads      CPU threads per rank, and OpenMP told to yield instead of spin
    launch       RankLaunch: what a rank is told, and its one spelling as environment variables  [pure]
"""
