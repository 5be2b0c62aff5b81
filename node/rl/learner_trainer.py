"""The learner's model side: GRPO steps, the log-prob recomputation check, publishing versions.

:class:`Trainer` owns the LoRA policy (models.rl.policy), AdamW over its adapter weights, the
environment, the adapters it published (the last few versions' weights stay in memory so a
group sampled under an older version can be checked against that version) and the run
directory: ``adapters/<sha256>.gguf``, ``checkpoints/ckpt-<v>.pt``, ``versions.json``.

Version discipline (models/rl/checkpoint.py): the weights resumed from the last checkpoint keep
that checkpoint's version; each step claims the next version in ``versions.json`` before its
adapter is exported, so no version number ever names two different sets of weights.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from models.rl.checkpoint import Checkpoint, VersionCounter, latest_checkpoint, save_checkpoint
from models.rl.checks import decode_problem, fingerprint_problem, fingerprint_shape_problem
from models.rl.distributed import Ranks
from models.rl.env import Environment
from models.rl.export import AdapterFile, export_adapter
from models.rl.grpo import mismatch_kl
from models.rl.policy import Policy, TokenSeq
from models.rl.update import Group, UpdateConfig, accumulate, encode_groups
from node.rl.learner_config import LearnerConfig
from protocol.rl.messages import Completion, RolloutJob, RolloutResultBody


@dataclass(frozen=True, slots=True)
class StepStats:
    version: int  # the version this step produced
    mean_reward: float  # over every completion of the step's groups, skipped ones included
    groups: int
    skipped: int  # groups with all-equal rewards (no signal)
    tokens: int
    masked: int  # tokens whose importance ratio left the bounds
    loss: float
    kl: float  # mean k3 KL(policy || base) per completion token, before the step
    step_s: float  # the learner's busy time for this step (forward, backward, export)
    rewards: tuple[float, ...] = ()  # every completion's reward, in group order
    entropy: float = 0.0  # the policy's mean entropy per completion token (nats)
    clip_fraction: float = 0.0  # masked / tokens: importance ratios outside the mask bounds
    group_staleness: tuple[int, ...] = ()  # per group: the version trained - its version
    #: completion tokens the workers returned since the previous step, per second of wall time
    #: (the learning loop sets it; 0 where nobody measured it)
    rollout_tokens_per_s: float = 0.0
    heldout_accuracy: float | None = None  # where the step ran the held-out evaluation ...
    heldout_half_width: float | None = None  # ... and the half-width of its 95% interval


def load_policy(config: LearnerConfig, ranks: Ranks | None = None,
                ) -> tuple[Policy, torch.optim.Optimizer, int | None]:
    """(policy, its AdamW, the version resumed from or None): the run directory's last
    checkpoint loaded where there is one. Every rank of a distributed learner calls this, so
    all start from the same weights and optimizer state."""
    torch.set_num_threads(config.learner_threads)
    torch.manual_seed(config.seed)
    policy = Policy.load(config.model or None, rank=config.lora_rank, alpha=config.lora_alpha,
                         seed=config.seed, n_threads=config.learner_threads)
    if ranks is not None:
        policy.model.to(ranks.device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate,
                                  weight_decay=config.weight_decay)
    ckpt = latest_checkpoint(Path(config.out_dir) / "checkpoints")
    if ckpt is None:
        return policy, optimizer, None
    policy.load_state(ckpt.adapter)
    optimizer.load_state_dict(ckpt.optimizer)
    return policy, optimizer, ckpt.version


def update_config(config: LearnerConfig) -> UpdateConfig:
    return UpdateConfig(temperature=config.temperature, max_tokens=config.max_tokens,
                        kl_coef=config.kl_coef)


class Trainer:
    def __init__(self, config: LearnerConfig, env: Environment, ranks: Ranks | None = None,
                 ) -> None:
        self.config, self.env, self.ranks = config, env, ranks
        self.out = Path(config.out_dir)
        self.policy, self.optimizer, self.resumed_from = load_policy(config, ranks)
        self.counter = VersionCounter(self.out / "versions.json")
        self.version = self.resumed_from or 0
        #: version -> (adapter weights, exported file); version 0 is the base (no file)
        self.published: OrderedDict[int, tuple[dict[str, torch.Tensor], AdapterFile | None]] = OrderedDict()
        self.published[self.version] = (self.policy.state(), self._export(self.version))
        #: version -> when it was published (time.monotonic(), shared by local processes)
        self.published_times = {self.version: time.monotonic()}
        self.rng = random.Random(config.seed)
        self.steps_done = 0
        self.mismatch_kls: list[float] = []  # every validation's figure, for the reports

    @property
    def vocab_size(self) -> int:
        return self.policy.vocab_size

    def _export(self, version: int) -> AdapterFile | None:
        if version == 0:
            return None
        cfg = self.policy.model.config
        return export_adapter(self.policy.state(), self.out / "adapters", version=version,
                              alpha=self.config.lora_alpha, n_head=cfg.num_attention_heads,
                              n_kv_head=cfg.num_key_value_heads)

    def adapter(self, version: int) -> tuple[str, str]:
        """(path, sha256) of a published version's adapter; ("", "") for the base."""
        f = self.published[version][1]
        return ("", "") if f is None else (str(f.path), f.sha256)

    # ------------------------------------------------------------ validation
    def groups_of(self, result: RolloutResultBody, job: RolloutJob) -> list[Group]:
        """Split a result into per-prompt groups and score them (rewards are ours alone)."""
        out, g = [], job.group_size
        for p, index in enumerate(result.prompt_indices):
            comps = result.completions[p * g:(p + 1) * g]
            rewards = tuple(self.env.reward(index, self.policy.detokenize(c.token_ids)) for c in comps)
            out.append(Group(result.policy_version, index, self.policy.prompt_ids(self.env.prompt(index)),
                             tuple((c.token_ids, c.logprobs) for c in comps), rewards))
        return out

    def check_logprobs(self, job: RolloutJob, result: RolloutResultBody) -> str | None:
        """The learner's model checks (models/rl/checks.py): every completion's token ids
        decode and its fingerprint covers its tokens; then ``validate_completions`` sampled
        completions of each prompt are recomputed under the result's version, one forward
        pass giving their log-probs (the mismatch KL must stay under the threshold) and their
        final-norm states (their fingerprints must open to them). None when all pass."""
        if result.policy_version not in self.published:
            return None  # older than every kept version, so past S: the staleness rule drops it
        for i, c in enumerate(result.completions):
            why = decode_problem(self.policy, c) or fingerprint_shape_problem(c)
            if why is not None:
                return f"completion {i}: {why}"
        g = job.group_size
        picks: list[tuple[TokenSeq, Completion]] = []
        for p, index in enumerate(result.prompt_indices):
            prompt = self.policy.prompt_ids(self.env.prompt(index))
            chosen = self.rng.sample(range(g), min(self.config.validate_completions, g))
            picks += [(TokenSeq(prompt, c.token_ids), c)
                      for c in (result.completions[p * g + i] for i in chosen)]
        with torch.no_grad(), self._weights(result.policy_version):
            lps, states = self.policy.logprobs_and_states(
                [s for s, _ in picks], temperature=self.config.temperature)
        for (_, c), h in zip(picks, states, strict=True):
            why = fingerprint_problem(h.cpu().numpy(), c)
            if why is not None:
                return why
        reported = [x for _, c in picks for x in c.logprobs]
        kl = mismatch_kl(reported, [x for lp in lps for x in lp.cpu().tolist()])
        self.mismatch_kls.append(kl)
        if kl > self.config.mismatch_kl_max:
            return f"log-probs disagree with recomputation (mismatch KL {kl:.3g} > {self.config.mismatch_kl_max:g})"
        return None

    @contextmanager
    def _weights(self, version: int) -> Iterator[None]:
        """Run the policy with a kept version's adapter weights inside the block."""
        if version == self.version:
            yield
            return
        current = self.policy.state()
        self.policy.load_state(self.published[version][0])
        try:
            yield
        finally:
            self.policy.load_state(current)

    # ------------------------------------------------------------ training
    def step(self, groups: list[Group], next_version: int) -> StepStats:
        """One AdamW step on ``groups`` (on every rank when distributed), then publish."""
        t = time.perf_counter()
        if self.ranks is not None:
            self.ranks.broadcast_bytes(encode_groups(next_version, groups))
        st = accumulate(self.policy, groups, update_config(self.config), self.ranks)
        if st.useful:
            self.optimizer.step()
        staleness = tuple(self.version - g.version for g in groups)
        self.publish(next_version)
        rewards = [r for g in groups for r in g.rewards]
        self.steps_done += 1
        return StepStats(version=next_version, mean_reward=sum(rewards) / max(len(rewards), 1),
                         groups=len(groups), skipped=st.skipped, tokens=st.tokens,
                         masked=st.masked, loss=st.loss, kl=st.kl,
                         step_s=time.perf_counter() - t, rewards=tuple(rewards),
                         entropy=st.entropy, clip_fraction=st.clip_fraction,
                         group_staleness=staleness)

    def stop_ranks(self) -> None:
        """Tell the other ranks the run is over (an empty batch)."""
        if self.ranks is not None:
            self.ranks.broadcast_bytes(b"")

    def publish(self, version: int) -> None:
        """Claim ``version``, export its adapter, keep its weights; checkpoint every m steps."""
        self.counter.claim(version)
        self.version = version
        self.published[version] = (self.policy.state(), self._export(version))
        self.published_times[version] = time.monotonic()
        while len(self.published) > self.config.staleness + 2:
            old, _ = self.published.popitem(last=False)
            self.published_times.pop(old, None)
        if (self.steps_done + 1) % self.config.checkpoint_every == 0:
            self.checkpoint()

    def checkpoint(self) -> None:
        save_checkpoint(self.out / "checkpoints", Checkpoint(
            version=self.version, adapter=self.policy.state(),
            optimizer=self.optimizer.state_dict(), counters={"steps": float(self.steps_done)}))

    def next_version(self) -> int:
        return self.counter.next_after(self.version)
