"""The root of the errors a restart cannot help: fix the input and launch again (exit status 2)."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input (data, tokenizer, pretrained model, a checkpoint this run must not continue
    from): fix it and launch again; a restart cannot help (exit status 2)."""
