"""Shared test setup: keep every test hermetic (no wandb traffic, no writes outside tmp dirs)."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
