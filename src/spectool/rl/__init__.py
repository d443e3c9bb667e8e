"""Online RL (GRPO) pieces for `train-rl`."""
