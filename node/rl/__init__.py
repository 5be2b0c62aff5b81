"""The node side of reinforcement learning: the learner (local and on the network), adapter
dissemination, and the market's RL services: rollout jobs posted by a learner
(rollout_jobs.py, its persisted state in rollout_state.py) and the workers that run them
(rollout_worker.py)."""
