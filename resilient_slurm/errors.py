"""The root of the errors a restart cannot help, and the one place an exception becomes an exit status.

Whether a failure is worth a restart is decided by its type: every error that says "fix the input
and launch again" derives from `InputError` (a malformed data file, a tokenizer without a chat
template, a config mistake, a checkpoint this run must not continue from, a model whose shapes
changed since its checkpoint, ...), and nothing translates one into another on the way up.
"""

from __future__ import annotations

from resilient_slurm.exit_codes import ExitCode


class InputError(ValueError):
    """Bad input (data, tokenizer, pretrained model, config, a checkpoint this run must not continue
    from): fix it and launch again; a restart cannot help (exit status 2)."""


def exit_code_for(exc: BaseException) -> ExitCode:
    """The status a rank ends with after `exc`: CONFIG (2, no restart) for bad input, FAILED (1,
    a restart may help) for everything else."""
    return ExitCode.CONFIG if isinstance(exc, InputError) else ExitCode.FAILED
