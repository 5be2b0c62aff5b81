"""A plug-in RL environment for the learner tests: short prompts (the tiny test model has a
512-token context) and a reward that varies between random completions, so groups carry signal."""

from __future__ import annotations


class TinyEnv:
    size = 6

    def prompt(self, index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Say {index}."}]

    def reward(self, prompt: int, completion: str) -> float:
        return len(set(completion)) / 10.0


def make() -> TinyEnv:
    return TinyEnv()
