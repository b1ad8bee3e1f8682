"""resilient_slurm: keeps long training runs alive on Slurm.

Kept import-free on purpose: `tools/xid_scan` imports `resilient_slurm.health` from a bare
Prolog/Epilog environment and must not pay for torch or Hydra.
"""
