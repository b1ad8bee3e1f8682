"""Process plumbing every side of a run shares (launcher, supervisor, ranks): signals and threads.

Modules:
    signals      the only caller of signal.signal: stop signals just record a request
    threads      CPU threads per rank, and OpenMP told to yield instead of spin
"""
