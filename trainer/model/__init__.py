"""Qwen2 model: config and presets, Flax modules, HF name mapping, checkpoint loading."""
