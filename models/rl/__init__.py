"""Reinforcement learning on the default model: LoRA policy, GRPO, environments, adapters."""
