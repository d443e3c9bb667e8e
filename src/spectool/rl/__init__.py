"""Online RL (GRPO) pieces for `train-rl` (issue 5)."""
