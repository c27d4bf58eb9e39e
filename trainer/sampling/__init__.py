"""Rollout engine: KV cache pytree and the prefill + while_loop sampler."""
