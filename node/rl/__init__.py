"""The node side of reinforcement learning: the learner and its rollout workers."""
