"""A generation through a chain of block servers, from the daemon (``symphony generate``).

The requester holds the model's embedding, final norm and output head (models.blocks.Head)
and its tokenizer; the blocks are the servers'. A generation tokenizes the prompt, opens a
chain (node/inference/client.py), decodes in a worker thread through the chain as a
``Target`` (plain greedy, or speculative decoding with a local drafter: models.speculative)
and reports what it measured. Servers that failed the chain are left out of new plans for
``EXCLUDE_MS``. Measured round trips (a hop's time minus its compute) feed the routing.
"""

from __future__ import annotations

import atexit
import time
from typing import Any

import trio

from models.blocks import Head, greedy, load_head
from node.inference.client import Chain, ChainError, ChainTarget, Directory

#: exponential average weight of a new round-trip sample
RTT_ALPHA = 0.3


class Requester:
    def __init__(self, service: Any, head: Head, tokenizer: Any) -> None:
        self.service = service
        self.head = head
        self.tokenizer = tokenizer
        self.rtt_ms: dict[str, float] = {}

    @classmethod
    def load(cls, service: Any) -> Requester:
        import llama_cpp

        head = load_head(service.model_path)
        tokenizer = llama_cpp.Llama(model_path=str(service.model_path), vocab_only=True,
                                    verbose=False)
        atexit.register(tokenizer.close)  # its finalizer can hang or fail at interpreter exit
        return cls(service, head, tokenizer)

    def observe_rtt(self, peer: str, ms: float) -> None:
        old = self.rtt_ms.get(peer)
        self.rtt_ms[peer] = ms if old is None else (1 - RTT_ALPHA) * old + RTT_ALPHA * ms

    def _log_failure(self, peer: str, detail: str) -> None:
        self.service.ctx.log.warning("inference.hop_failed", peer=peer, detail=detail[:300])

    def tokenize(self, text: str) -> list[int]:
        add_bos = self.tokenizer.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
        return list(self.tokenizer.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def detokenize(self, ids: list[int]) -> str:
        return bytes(self.tokenizer.detokenize(ids)).decode("utf-8", "replace")

    def chain(self, max_length: int) -> Chain:
        s = self.service
        directory = Directory(servers=s.servers, open_stream=s.open_stream, report=s.report,
                              rtt_ms=lambda: {**s.rtt_ms(), **self.rtt_ms},
                              observe_rtt=self.observe_rtt, on_failure=self._log_failure)
        return Chain(directory, model=s.model_name, n_blocks=s.n_blocks,
                     hidden_size=int(self.head.config.hidden_size), max_length=max_length,
                     precision=s.precision)

    async def generate(self, prompt: str, max_tokens: int, speculative: int = 0,
                       rule: str = "greedy") -> dict[str, Any]:
        if not prompt:
            raise ValueError("an empty prompt")
        if not 1 <= max_tokens <= 4096:
            raise ValueError(f"max_tokens must be within 1..4096, got {max_tokens}")
        if not 0 <= speculative <= 16:
            raise ValueError(f"speculative must be within 0..16, got {speculative}")
        ids = self.tokenize(prompt)
        chain = self.chain(len(ids) + max_tokens + speculative + 1)
        stop = [int(self.tokenizer.token_eos())]
        started = time.perf_counter()
        try:
            await chain.open()
            route = chain.route
            target = ChainTarget(self.head, chain)
            if speculative:
                out = await trio.to_thread.run_sync(self._speculative, target, ids, max_tokens,
                                                    speculative, stop, rule)
            else:
                out = await trio.to_thread.run_sync(self._greedy, target, ids, max_tokens, stop)
        except ChainError as exc:
            raise ValueError(f"no chain: {exc}") from exc
        finally:
            final = chain.route
            now = self.service.ctx.clock()
            for peer in chain.excluded:
                self.service.failed_until[peer] = now + self.service.exclude_ms
            with trio.CancelScope(shield=True):
                await chain.close()
        wall = time.perf_counter() - started
        tokens = out["tokens"]
        return {**out, "text": self.detokenize(tokens), "prompt_ids": ids,
                "wall_s": round(wall, 3),
                "tokens_per_s": round(len(tokens) / wall, 3) if wall > 0 else 0.0,
                "chain": [{"peer": p, "start": a, "end": b} for p, a, b in route],
                "final_chain": [{"peer": p, "start": a, "end": b} for p, a, b in final],
                "recoveries": chain.recoveries, "precision": chain.precision.value}

    @staticmethod
    def _greedy(target: ChainTarget, ids: list[int], max_tokens: int,
                stop: list[int]) -> dict[str, Any]:
        return {"tokens": greedy(target, ids, max_tokens, stop), "speculative": 0,
                "acceptance_rate": None}

    def _speculative(self, target: ChainTarget, ids: list[int], max_tokens: int, k: int,
                     stop: list[int], rule: str = "greedy") -> dict[str, Any]:
        from models.drafters import LlamaDrafter
        from models.speculative import SpeculativeConfig, speculative_generate
        from protocol.inference.speculative import Rule

        # k is the longest draft: each step's length adapts to the acceptance and step times
        # measured so far (protocol.inference.speculative.AdaptiveK)
        config = SpeculativeConfig(k=None, k_max=k, k_init=min(4, k), rule=Rule(rule))
        drafter = LlamaDrafter(self.service.model_path)
        try:
            gen = speculative_generate(target, ids, max_tokens, drafter, config, stop=stop)
        finally:
            drafter.close()  # its llama.cpp context, not left to the garbage collector
        return {"tokens": list(gen.tokens), "speculative": k, "rule": rule,
                "acceptance_rate": round(gen.acceptance_rate, 4), "steps": gen.steps,
                "mean_k": round(gen.drafted / gen.steps, 2) if gen.steps else 0.0}
