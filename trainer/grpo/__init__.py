"""GRPO: group-relative advantages, the clipped surrogate objective, and the reward functions."""
