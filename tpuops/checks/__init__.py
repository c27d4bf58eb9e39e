"""Checks before and around a run: fit (the config compiled for its TPU) and doctor (the workers' health)."""
