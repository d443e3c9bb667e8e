"""Adapters that put spectool drafts inside RL frameworks (TRL)."""
