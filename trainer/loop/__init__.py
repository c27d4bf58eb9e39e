"""The GRPO step in phases: setup, rollout, score, update, record (log, checkpoint, eval); train.run loops them."""
