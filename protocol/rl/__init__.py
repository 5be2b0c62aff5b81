"""Rules of RL rollout jobs: messages, staleness, capacity, validation and the job book."""
