"""spectool: the life of a speculative-decoding draft model for RL post-training."""

__version__ = "0.1.0"
