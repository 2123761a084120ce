"""Reward computers for configs/config.yaml, in the layout of Bailian's reward service."""
