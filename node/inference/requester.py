"""A generation through a chain of block servers, from the daemon (``symphony generate``, and
asks for a model served only in parts: node/market/chain_asks.py).

The requester holds the model's embedding, final norm and output head (models.blocks.Head)
and its tokenizer; the blocks are the servers'. A generation opens a chain
(node/inference/chain.py), decodes in a worker thread through the chain as a ``Target``
(models.speculative: plain decoding, or speculative decoding with a local drafter) and reports
what it measured. Drafters stay loaded between generations (models.drafters.DrafterPool), and
so does what each chain's draft-length rule learned (its AdaptiveK, per rule and route): the
next generation over the same chain starts from the acceptance and step times it measured. Servers that failed the chain are left out of new plans for ``EXCLUDE_MS``.
Measured round trips (a hop's time minus its compute) feed the routing.

How tokens are chosen (:class:`Decoding`): temperature 0 is greedy decoding (drafts verified
greedily: the output is plain greedy decoding's; or by MARS, faster and not exact);
temperature > 0 samples from softmax(logits / T) cut to the ``top_p`` nucleus, seeded, and
drafts (drawn by the drafter at the same temperature) are verified by speculative rejection
sampling, so the output is distributed as plain sampling's. A chat is rendered through the
model's own chat template, exactly as the executor renders it (models.backend.render_chat),
and generation ends at the model's end-of-turn tokens, at ``max_tokens``, or at the token that
completes a stop string (the text keeps the stop string; the API cuts it where it shows it).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from typing import Any

import trio

from models.backend import END_OF_TURN, Message, chat_template_of, render_chat
from models.blocks import Head, bytes_per_position, load_head
from models.drafters import DrafterPool
from node.inference.chain import Chain, ChainError, ChainTarget, Directory
from node.inference.decoding import Decoding, OnText, stop_length
from node.inference.wire import wire_precision

#: exponential average weight of a new round-trip sample
RTT_ALPHA = 0.3
#: draft-length rules kept (one per rule, longest draft and route), the oldest dropped first
MAX_ADAPTIVE = 16
#: generations run again after a stage check convicted a stage of the chain
MAX_RERUNS = 2
#: a stage a check convicted is left out of this node's chains this long
CONVICTED_EXCLUDE_MS = 60 * 60_000


class Requester:
    def __init__(self, service: Any, head: Head, tokenizer: Any) -> None:
        self.service = service
        self.head = head
        self.tokenizer = tokenizer
        self.rtt_ms: dict[str, float] = {}
        meta = tokenizer.metadata
        self.chat_template: str | None = chat_template_of(meta)
        self.bos_text = self._piece(int(tokenizer.token_bos()))
        self.eos_text = self._piece(int(tokenizer.token_eos()))
        ends = {int(tokenizer.token_eos())}
        for special in END_OF_TURN:
            ids = tokenizer.tokenize(special.encode(), add_bos=False, special=True)
            if len(ids) == 1:
                ends.add(int(ids[0]))
        self.end_ids = frozenset(ends)
        self.drafters = DrafterPool(service.section.drafter or service.model_path,
                                    target=service.model_path)
        self._adaptive: dict[tuple[str, int, tuple[str, ...]], Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, service: Any) -> Requester:
        import llama_cpp

        head = load_head(service.model_path)
        tokenizer = llama_cpp.Llama(model_path=str(service.model_path), vocab_only=True,
                                    verbose=False)
        atexit.register(tokenizer.close)  # its finalizer can hang or fail at interpreter exit
        requester = cls(service, head, tokenizer)
        atexit.register(requester.drafters.close)
        # the drafter and the lookahead's, loaded now rather than in the first generation
        drafters = [requester.drafters.take() for _ in range(2)]
        for drafter in drafters:
            requester.drafters.give(drafter)
        return requester

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return bytes(self.tokenizer.detokenize([token], special=True)).decode("utf-8", "replace")

    def observe_rtt(self, peer: str, ms: float) -> None:
        old = self.rtt_ms.get(peer)
        self.rtt_ms[peer] = ms if old is None else (1 - RTT_ALPHA) * old + RTT_ALPHA * ms

    def _log_failure(self, peer: str, detail: str) -> None:
        self.service.ctx.log.warning("inference.hop_failed", peer=peer, detail=detail[:300])

    def tokenize(self, text: str) -> list[int]:
        add_bos = self.tokenizer.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
        return list(self.tokenizer.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def detokenize(self, ids: Sequence[int]) -> str:
        return bytes(self.tokenizer.detokenize([int(t) for t in ids])).decode("utf-8", "replace")

    def prompt_ids(self, prompt: str | Sequence[Message]) -> list[int]:
        """Token ids of raw text, or of chat messages through the model's chat template."""
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        return self.tokenize(render_chat(self.chat_template, list(prompt), self.bos_text,
                                         self.eos_text))

    def chain(self, max_length: int) -> Chain:
        s = self.service
        me = s.ctx.identity.peer_id  # our own stage: no link crossed, no round trip
        directory = Directory(servers=s.chain_servers, open_stream=s.open_stream,
                              report=s.report,
                              rtt_ms=lambda: {**s.rtt_ms(), **self.rtt_ms, me: 0.0},
                              observe_rtt=self.observe_rtt, on_failure=self._log_failure,
                              spawn=s.start_soon)
        return Chain(directory, model=s.model_name, n_blocks=s.n_blocks,
                     hidden_size=int(self.head.config.hidden_size), max_length=max_length,
                     kv_bytes_per_block=bytes_per_position(self.head.config, 1),
                     precision=wire_precision(s.section.precision,
                                              str(getattr(self.head.config, "model_type", ""))),
                     forwarding=s.section.forwarding,
                     link_delay_ms=round(s.section.link_delay_ms))

    async def generate(self, prompt: str, max_tokens: int, speculative: int = 0,
                       rule: str = "greedy", **sampling: Any) -> dict[str, Any]:
        """``symphony generate``: raw text through a chain (``sampling``: Decoding's
        temperature, top_p, seed, stop)."""
        if not prompt:
            raise ValueError("an empty prompt")
        decoding = Decoding(max_tokens=max_tokens, speculative=speculative, rule=rule,
                            **sampling)
        return await self.complete(self.tokenize(prompt), decoding)

    async def complete(self, ids: list[int], decoding: Decoding,
                       on_text: OnText | None = None) -> dict[str, Any]:
        """Generate after prompt ``ids`` through a chain, checked (node.inference.
        stage_checks); a generation whose check convicts a stage runs again on a chain without
        it (its text is streamed to ``on_text`` once, the first time)."""
        if not ids:
            raise ValueError("an empty prompt")
        convicted: list[str] = []
        chains: list[Any] = []  # each attempt's chain, the last one's output is returned
        attempt_checks: list[dict[str, Any]] = []
        for attempt in range(1 + MAX_RERUNS):
            out = await self._complete(ids, decoding, on_text if not attempt else None)
            checks = out["stage_checks"]
            convicted += checks["convicted"]
            chains.append(out["chain"])
            attempt_checks.append(checks)
            # a stage convicted, or one that would not show its states: not the honest output
            if not checks["convicted"] and not checks.get("dropped"):
                break
        else:
            raise ValueError(f"stage checks failed the chain in {1 + MAX_RERUNS} attempts "
                             f"(convicted: {', '.join(p[-8:] for p in convicted) or 'none'})")
        return {**out, "convicted": convicted, "reruns": attempt, "attempt_chains": chains,
                "attempt_checks": attempt_checks}

    async def _check(self, chain: Chain) -> dict[str, Any]:
        """Stage checks of a finished generation's chain; convictions go to the ledger and
        the convicted stages out of this node's chains for ``CONVICTED_EXCLUDE_MS``."""
        from node.inference.stage_checks import check_chain
        from node.verification.service import submit_attestation

        s = self.service
        report = await check_chain(chain, s.section.check_rate, s.ctx.identity.peer_id)
        for attest in report.convicted:
            s.failed_until[attest.subject] = s.ctx.clock() + CONVICTED_EXCLUDE_MS
            chain.excluded.add(attest.subject)
            s.ctx.log.warning("inference.stage_convicted", peer=attest.subject,
                              outcome=attest.outcome)
            await submit_attestation(s.ctx, attest)
        return {"checked": report.checked, "steps_checked": report.steps_checked,
                "unchecked": report.unchecked, "dropped": report.dropped,
                "prefilled": report.prefilled,
                "convicted": [a.subject for a in report.convicted],
                "check_s": round(report.check_s, 3)}

    async def _complete(self, ids: list[int], decoding: Decoding,
                        on_text: OnText | None) -> dict[str, Any]:
        chain = self.chain(len(ids) + decoding.max_tokens + decoding.speculative + 1)
        started = time.perf_counter()
        try:
            await chain.open()
            open_s = time.perf_counter() - started
            route = chain.route
            target = ChainTarget(self.head, chain)
            out = await trio.to_thread.run_sync(self._decode, target, ids, decoding, on_text)
            checks = await self._check(chain) if self.service.section.check_rate > 0 else {
                "convicted": []}
        except ChainError as exc:
            raise ValueError(f"no chain: {exc}") from exc
        finally:
            final = chain.route
            now = self.service.ctx.clock()
            for peer in chain.excluded:  # a convicted stage's longer exclusion stays
                self.service.failed_until[peer] = max(self.service.failed_until.get(peer, 0),
                                                      now + self.service.exclude_ms)
            with trio.CancelScope(shield=True):
                await chain.close()
        wall = time.perf_counter() - started
        tokens = out["tokens"]
        return {**out, "prompt_ids": ids, "prompt_tokens": len(ids),
                "wall_s": round(wall, 3), "open_s": round(open_s, 3),
                "tokens_per_s": round(len(tokens) / wall, 3) if wall > 0 else 0.0,
                "chain": [{"peer": p, "start": a, "end": b} for p, a, b in route],
                "final_chain": [{"peer": p, "start": a, "end": b} for p, a, b in final],
                "recoveries": chain.recoveries, "precision": chain.precision.value,
                "stage_checks": checks}

    def _decode(self, target: ChainTarget, ids: list[int], decoding: Decoding,
                on_text: OnText | None) -> dict[str, Any]:
        """The decoding loop (in a worker thread): tokens, text and why it ended."""
        from models.speculative import SpeculativeConfig, speculative_generate
        from protocol.inference.speculative import Rule

        d = decoding
        sampled = d.temperature > 0.0
        rule = Rule.SAMPLING if sampled else Rule(d.rule)
        # speculative K is the longest draft: each step's length adapts to the acceptance and
        # step times measured so far (protocol.inference.speculative.AdaptiveK)
        config = SpeculativeConfig(rule=rule, temperature=d.temperature if sampled else 1.0,
                                   top_p=d.top_p, k=None if d.speculative else 0,
                                   k_max=max(1, d.speculative), k_init=min(4, max(1, d.speculative)))
        watch = on_text is not None or bool(d.stop)

        def on_tokens(tokens: Sequence[int]) -> bool:
            trio.from_thread.check_cancelled()  # a deadline passed, the daemon stops
            if not watch:
                return False
            kept = [t for t in tokens if t not in self.end_ids]
            text = self.detokenize(kept)
            halt = any(s in text for s in d.stop)
            if on_text is not None:
                halt = bool(trio.from_thread.run_sync(on_text, text, len(kept))) or halt
            return halt

        if not d.speculative:
            gen = speculative_generate(target, ids, d.max_tokens, None, config, seed=d.seed,
                                       stop=sorted(self.end_ids), on_tokens=on_tokens)
        else:
            gen = self._speculate(target, ids, d, config, on_tokens)
        return self._ending(list(gen.tokens), d) | _measured(gen, d, rule.value)

    def _speculate(self, target: ChainTarget, ids: list[int], d: Decoding, config: Any,
                   on_tokens: Any) -> Any:
        """speculative_generate with drafters from the pool (a second one for the lookahead
        when drafts are deterministic) and the draft-length rule this route left."""
        from models.speculative import speculative_generate
        from protocol.inference.speculative import AdaptiveK, Rule

        route = target.chain.route if isinstance(target, ChainTarget) else []
        key = (config.rule.value, config.k_max, tuple(p for p, _, _ in route))
        with self._lock:
            adaptive = self._adaptive.pop(key, None)
        adaptive = adaptive or AdaptiveK(k_init=config.k_init, k_max=config.k_max)
        drafters = [self.drafters.take(d.temperature)]
        if config.rule is not Rule.SAMPLING and self.service.section.lookahead:
            drafters.append(self.drafters.take(0.0))
        finished = False
        try:
            gen = speculative_generate(target, ids, d.max_tokens, drafters[0], config,
                                       seed=d.seed, stop=sorted(self.end_ids),
                                       on_tokens=on_tokens, adaptive=adaptive,
                                       lookahead=drafters[1] if len(drafters) > 1 else None,
                                       # idle beside this node's own stage, if it serves one
                                       lookahead_idle=self.service.host is not None)
            finished = True
        finally:
            for drafter in drafters:  # one a failure left mid-way is not lent again
                if finished:
                    self.drafters.give(drafter)
                else:
                    drafter.close()
        with self._lock:
            self._adaptive[key] = adaptive
            while len(self._adaptive) > MAX_ADAPTIVE:
                self._adaptive.pop(next(iter(self._adaptive)))
        return gen

    def _ending(self, tokens: list[int], d: Decoding) -> dict[str, Any]:
        """The generated tokens up to where generation ends, their text and finish reason."""
        finish = "length" if len(tokens) >= d.max_tokens else "stop"
        cut = stop_length(tokens, d.stop, self.detokenize)
        if cut is not None:
            tokens, finish = tokens[:cut], "stop"
        ended = bool(tokens) and tokens[-1] in self.end_ids
        text_ids = tokens[:-1] if ended else tokens
        if ended:
            finish = "stop"
        return {"tokens": tokens, "completion_tokens": len(text_ids),
                "text": self.detokenize(text_ids), "finish_reason": finish}


def _measured(gen: Any, d: Decoding, rule: str) -> dict[str, Any]:
    """What a generation (models.speculative.Generation) measured, for its answer."""
    spec = bool(d.speculative)
    return {
        "speculative": d.speculative, "rule": rule, "temperature": d.temperature,
        "top_p": d.top_p, "seed": d.seed,
        # drafts kept over drafts made, and over drafts examined (the kept ones and each
        # step's first rejected one: the chance a draft is kept given those before it were)
        "acceptance_rate": round(gen.acceptance_rate, 4) if spec else None,
        "position_acceptance": round(gen.position_acceptance, 4) if spec else None,
        "steps": gen.steps, "mean_k": round(gen.drafted / gen.steps, 2) if gen.steps else 0.0,
        "draft_lengths": list(gen.ks),
        "prefill_s": round(gen.prefill_s, 3), "target_s": round(gen.target_s, 3),
        # drafting the loop waited for; the drafter's time per token it drafted (its speed
        # beside the chain's stages); steps whose draft the lookahead began, its tokens
        "draft_s": round(gen.draft_s, 3),
        "draft_ms_per_token": round(gen.drafter_ms_per_token, 2) if spec else None,
        "lookahead_hits": gen.lookahead_hits, "lookahead_tokens": gen.lookahead_tokens}
