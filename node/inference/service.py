"""Distributed inference in the daemon: serve a range of a model's blocks, run chains over them.

Serving (``serve_blocks`` = ``A:B`` or ``auto``; off by default): the node loads decoder blocks
[A, B) of ``[inference] model`` (models.blocks: only those layers are dequantized), measures
its milliseconds per block per token, serves inference sessions on the ``inference`` stream
protocol (node/inference/server.py, rules in protocol/inference/session.py) and advertises a
``BlockOffer`` in its capability record (the ledger service asks :meth:`block_offers`).
``auto`` picks the weakest-covered window from the ledger (protocol.inference.routing.
choose_blocks, window size from free memory and speed), re-checks every ``auto_check_s`` and
moves only while no session is open, with hysteresis.

Requesting: :meth:`InferenceService.generate` plans a chain over the ledger's block offers
and this node's own (:meth:`chain_servers`: its own stage is a hop with no round trip, reached
over an in-process stream, node/inference/local.py), waits up to ``wait_s`` while some blocks
are offered by no one yet (a server still loading, an offer not yet gossiped; the wait ends in
an error naming the missing blocks), decodes through it (greedy, or speculative with a local drafter when ``speculative`` > 0) and
reports tokens/s, the chain and the recoveries. HTTP (mounted under ``/inference``):
``GET /inference/`` (what this node serves) and, with the API token,
``POST /inference/generate`` (JSON ``prompt``, ``max_tokens``, ``speculative``, ``wait_s``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import trio

from node.inference.cache_budget import cache_budget, ram_free_bytes
from node.inference.local import local_pair
from node.inference.machine_probe import device_of, measure_ms_per_block
from node.inference.section import InferenceSection
from node.inference.wire import SessionStream
from node.runtime.dialing import dial_first, dial_plan
from node.service import NurseryService
from node.transport import TransportError
from protocol.inference.routing import (
    Server,
    blocks_text,
    choose_blocks,
    missing_blocks,
    parse_serve_blocks,
    span_for,
)
from protocol.inference.session import (
    FreeCache,
    Misbehaved,
    ServedBlocks,
    SessionLimits,
    SessionServer,
)
from protocol.ledger.records import BlockOffer
from protocol.names import protocol_id

INFERENCE_PROTOCOL_NAME = "inference"
#: a window's serving time per token ``auto`` aims under (bounds the span by speed)
AUTO_BUDGET_MS_PER_TOKEN = 200.0
#: the host memory ``auto`` sizes its span from when /proc/meminfo cannot tell
AUTO_UNKNOWN_FREE_BYTES = 4 << 30
#: a server that failed a chain of ours is left out of new plans for this long
EXCLUDE_MS = 5 * 60_000
#: while a generation waits for blocks nobody offers yet, the offers are looked at this often
WAIT_POLL_S = 0.5


def inference_protocol(network_id: str) -> str:
    return protocol_id(network_id, INFERENCE_PROTOCOL_NAME)


class InferenceService(NurseryService):
    name = "inference"
    config_section: ClassVar[type | None] = InferenceSection

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.section: InferenceSection = ctx.config.section(self.name)
        self.limits = SessionLimits(
            max_sessions=self.section.max_sessions,
            max_tokens_per_session=self.section.max_tokens_per_session,
            max_cache_bytes=self.section.max_cache_mb << 20,
            idle_timeout_ms=int(self.section.idle_timeout_s * 1000))
        self.want = parse_serve_blocks(getattr(ctx.config, "serve_blocks", ""))
        self._machine = SessionServer(ServedBlocks("", 0, 0, 0, 0), self.limits)
        self.host: Any = None  # node.inference.server.StageHost while serving
        self.ms_per_block = 0.0
        self.model_name = ""
        self.model_path: Any = None
        self.n_blocks = 0
        self.problem = ""
        self._requester: Any = None  # node.inference.requester.Requester, built on first use
        self.failed_until: dict[str, int] = {}
        self.exclude_ms = EXCLUDE_MS
        self.moves = 0
        #: with a model from peers: bytes_fetched (from peers), model_bytes (the whole file)
        self.fetched: dict[str, int] = {}

    @property
    def machine(self) -> SessionServer:
        return self._machine

    # ------------------------------------------------------------ serving

    async def start(self) -> None:
        if self._from_peers():
            return  # no file here: on_running fetches the stage's tensors from peers
        try:
            # the metadata alone: importing torch and transformers for it took most of every
            # daemon's start (13-50 s on a loaded machine); a stage server loads them in _serve
            from models.gguf_reader import block_count
            from models.registry import resolve

            info = resolve(self.section.model or None)
            self.n_blocks = block_count(info.path)
        except Exception as exc:  # no models extra, or no such model: serve and ask nothing
            self.problem = f"no model for inference: {exc}"
            self.ctx.log.warning("inference.no_model", error=str(exc))
            return
        self.model_name, self.model_path = info.name, info.path
        if self.section.drafter:  # one with another tokenizer is refused, naming both models
            from models.drafters import check_pairing

            check_pairing(self.section.drafter, info.path)
        if self.section.threads:  # a requester's head runs on them too
            import torch

            torch.set_num_threads(self.section.threads)
        if self.want is None:
            return
        blocks = self._auto_window(None) if self.want == "auto" else self.want
        if blocks[1] > self.n_blocks:
            raise ValueError(f"serve_blocks {blocks[0]}:{blocks[1]} is outside the "
                             f"{self.n_blocks} blocks of {self.model_name}")
        await self._serve(blocks)
        self.ctx.transport.set_stream_handler(inference_protocol(self.ctx.network_id),
                                              self._serve_stream)

    async def _serve(self, blocks: tuple[int, int]) -> None:
        from models.blocks import load_stage
        from node.inference.server import StageHost

        stage = await trio.to_thread.run_sync(load_stage, self.model_path, *blocks,
                                              self.section.device)
        if self.section.dishonest:  # tests and benches: a stage that lies
            from models.dishonest import DishonestStage

            stage = await trio.to_thread.run_sync(DishonestStage, stage, self.section.dishonest,
                                                  self.section.dishonest_scale)
            self.ctx.log.warning("inference.dishonest", kind=self.section.dishonest)
        self.ms_per_block = await trio.to_thread.run_sync(measure_ms_per_block, stage)
        served = ServedBlocks(self.model_name, blocks[0], blocks[1], stage.hidden_size,
                              stage.bytes_per_position // max(1, blocks[1] - blocks[0]))
        if not self.section.max_cache_mb:  # sized from the free memory, the stage loaded
            budget = await trio.to_thread.run_sync(cache_budget, device_of(stage))
            self.limits = replace(self.limits, max_cache_bytes=budget.bytes)
            self.ctx.log.info("inference.cache_budget", device=budget.device,
                              free_mib=budget.free_bytes >> 20, cache_mib=budget.bytes >> 20)
        self._machine = SessionServer(served, self.limits)
        self.host = StageHost(stage, self._machine, clock=self.ctx.clock, report=self.report,
                              log=self.ctx.log, delay_ms=self.section.link_delay_ms,
                              open_stream=self.open_stream, sign=self.ctx.identity.sign,
                              ms_per_block=self.ms_per_block)
        self.ctx.log.info("inference.serving", model=self.model_name, start=blocks[0],
                          end=blocks[1], ms_per_block=round(self.ms_per_block, 3),
                          param_mib=round(stage.param_bytes / 2**20, 1))

    async def _serve_stream(self, peer: str, stream: Any) -> None:
        if self.host is not None:
            await self.host.serve(peer, stream)

    async def report(self, peer: str, detail: str) -> None:
        """Count a session fault against ``peer`` (the driver keeps the penalty book)."""
        await self.ctx.submit(self.name, Misbehaved(peer, detail))

    async def perform(self, effect: object) -> None:
        if isinstance(effect, FreeCache) and self.host is not None:
            await self.host.perform_expiry([effect])

    def block_offers(self) -> tuple[BlockOffer, ...]:
        if self.host is None:
            return ()
        served = self._machine.served
        return (BlockOffer(model=self.model_name[:128], start=served.start, end=served.end,
                           n_blocks=self.n_blocks, ms_per_block=float(self.ms_per_block),
                           free_sessions=self._machine.free_sessions,
                           max_sessions=self.limits.max_sessions,
                           free_cache_bytes=self._machine.free_cache_bytes),)

    async def on_running(self) -> None:
        if self.want == "auto" and self.host is not None:
            self.start_soon(self._auto_loop)
        if self._from_peers():
            self.start_soon(self._serve_from_peers)

    def _from_peers(self) -> bool:
        """``model`` is a weights hash and ``serve_blocks`` a range: the stage's weights come
        from the peers that offer that model (node/inference/weights.py)."""
        model = self.section.model.lower()
        return (isinstance(self.want, tuple) and len(model) == 64
                and all(c in "0123456789abcdef" for c in model))

    async def _serve_from_peers(self) -> None:
        from node.inference.weights import fetch_stage

        try:
            got = await fetch_stage(self.ctx.services["relay"], self.section.model, *self.want,
                                    self.ctx.data_dir / "models", self.ctx.log)
        except (KeyError, ValueError) as exc:
            self.problem = f"no model for inference: {exc}"
            self.ctx.log.warning("inference.no_model", error=str(exc))
            return
        self.model_name, self.model_path, self.n_blocks = got.model_name, got.path, got.n_blocks
        self.fetched = {"bytes_fetched": got.bytes_fetched, "model_bytes": got.total_size}
        await self._serve(self.want)  # type: ignore[arg-type]
        self.ctx.transport.set_stream_handler(inference_protocol(self.ctx.network_id),
                                              self._serve_stream)

    async def _auto_loop(self) -> None:
        while True:
            await trio.sleep(self.section.auto_check_s)  # a periodic coverage check
            if self._machine.sessions:
                continue  # never mid-session
            current = (self._machine.served.start, self._machine.served.end)
            window = self._auto_window(current)
            if window != current:
                self.ctx.log.info("inference.moving", old=current, new=window)
                await self._serve(window)
                self.moves += 1

    def _auto_window(self, current: tuple[int, int] | None) -> tuple[int, int]:
        from models.blocks import bytes_per_block

        free = ram_free_bytes(unknown=AUTO_UNKNOWN_FREE_BYTES)
        span = span_for(self.n_blocks, bytes_per_block(self.model_path), free)
        if self.ms_per_block > 0:  # a slow node holds fewer blocks
            span = max(1, min(span, int(AUTO_BUDGET_MS_PER_TOKEN / self.ms_per_block)))
        if self.section.auto_max_blocks:
            span = min(span, self.section.auto_max_blocks)
        return choose_blocks(self.servers(include_self=True), self.model_name, self.n_blocks,
                             span, own_peer=self.ctx.identity.peer_id, current=current)

    # ------------------------------------------------------------ requesting

    def servers(self, include_self: bool = False) -> list[Server]:
        """Every live block offer in the ledger (our own left out unless asked)."""
        ledger = self.ctx.services.get("ledger")
        if ledger is None:
            return []
        now = self.ctx.clock()
        out = []
        for held in ledger.machine.view.state.live_records(ledger.now_ms()):
            rec = held.record
            if rec.peer_id == self.ctx.identity.peer_id and not include_self:
                continue
            if rec.peer_id in self.section.avoid_peers:
                continue
            if self.failed_until.get(rec.peer_id, 0) > now:
                continue
            for b in rec.blocks:
                out.append(Server(peer=rec.peer_id, model=b.model, start=b.start, end=b.end,
                                  ms_per_block=b.ms_per_block, free_sessions=b.free_sessions,
                                  max_sessions=b.max_sessions,
                                  free_cache_bytes=b.free_cache_bytes))
        return out

    def chain_servers(self) -> list[Server]:
        """The servers a chain of ours may use: the ledger's offers of other peers and, while
        this node serves blocks, its own offer as it stands now (not a ledger record that may
        lag behind)."""
        out = self.servers()
        me = self.ctx.identity.peer_id
        if self.failed_until.get(me, 0) > self.ctx.clock():
            return out
        for b in self.block_offers():
            out.append(Server(peer=me, model=b.model, start=b.start, end=b.end,
                              ms_per_block=b.ms_per_block, free_sessions=b.free_sessions,
                              max_sessions=b.max_sessions, free_cache_bytes=b.free_cache_bytes))
        return out

    def missing(self) -> list[tuple[int, int]]:
        """The ranges of the model's blocks no one (this node included) offers now."""
        if not self.n_blocks:
            return []
        return missing_blocks(self.chain_servers(), self.model_name, self.n_blocks)

    async def wait_for_blocks(self, wait_s: float) -> None:
        """Return once every block of the model is offered; wait at most ``wait_s`` (a server
        still loading, an offer not yet in the ledger), logging what is missing whenever that
        changes; ValueError naming the missing blocks when the wait ends without them."""
        missing = self.missing()
        shown: list[tuple[int, int]] = []
        with trio.move_on_after(wait_s):
            while missing and wait_s > 0:
                if missing != shown:
                    self.ctx.log.info("inference.waiting_for_blocks", model=self.model_name,
                                      missing=blocks_text(missing), wait_s=wait_s)
                    shown = missing
                await trio.sleep(WAIT_POLL_S)  # offers arrive by gossip: no event to wait on
                missing = self.missing()
        if missing:
            raise ValueError(f"{blocks_text(missing)} of {self.model_name} (of "
                             f"{self.n_blocks}) are served by no peer"
                             + (f" (waited {wait_s:g} s)" if wait_s > 0 else ""))

    def rtt_ms(self) -> dict[str, float]:
        """Ping round trips the membership service measured, per connected peer."""
        membership = self.ctx.services.get("membership")
        conns = getattr(getattr(membership, "machine", None), "conns", {})
        return {p: float(c.rtt_ms) for p, c in conns.items() if c.rtt_ms is not None}

    def addresses(self, peer: str) -> tuple[str, ...]:
        ledger = self.ctx.services.get("ledger")
        if ledger is None:
            return ()
        for held in ledger.machine.view.state.live_records(ledger.now_ms()):
            if held.record.peer_id == peer:
                return tuple(held.record.listen_addrs)
        return ()

    async def open_stream(self, peer: str) -> SessionStream:
        """A session stream to ``peer``'s stage: over libp2p, or to this node's own stage over
        an in-process stream (no link crossed: no emulated delay either)."""
        if peer == self.ctx.identity.peer_id:
            host = self.host
            if host is None:
                raise TransportError("this node serves no blocks")
            mine, theirs = local_pair(peer)
            self.start_soon(host.serve, peer, theirs)
            return SessionStream(mine)
        transport = self.ctx.transport
        if peer not in transport.connected_peers():
            # its addresses side by side, as the driver dials (node/runtime/dialing.py): a
            # stage behind a NAT is reached through its relay, not after its private address's
            # dial timeout
            plan, errors = dial_plan(peer, self.addresses(peer))
            outcome = await dial_first(transport.connect, plan)
            if outcome.addr is None:
                self.ctx.log.info("inference.dial_failed", peer=peer,
                                  error="; ".join([*errors, *outcome.errors]))
        raw = await transport.open_stream(peer, inference_protocol(self.ctx.network_id))
        return SessionStream(raw, self.section.link_delay_ms)

    async def requester(self) -> Any:
        """The chain requester (node.inference.requester.Requester), loaded on first use."""
        from node.inference.requester import Requester

        if not self.model_name:
            raise ValueError(self.problem or "no model for inference")
        if self._requester is None:
            self._requester = await trio.to_thread.run_sync(Requester.load, self)
        return self._requester

    async def generate(self, prompt: str, max_tokens: int, speculative: int = 0,
                       rule: str = "greedy", wait_s: float = 0.0,
                       **sampling: Any) -> dict[str, Any]:
        requester = await self.requester()
        await self.wait_for_blocks(wait_s)
        return await requester.generate(prompt, max_tokens, speculative, rule, **sampling)

    def status(self) -> dict[str, Any]:
        served = self._machine.served
        return {"model": self.model_name, "serving": self.host is not None,
                "blocks": [served.start, served.end] if self.host is not None else None,
                "ms_per_block": round(self.ms_per_block, 3),
                "sessions": len(self._machine.sessions),
                "free_cache_bytes": self._machine.free_cache_bytes,
                "forwards": self.host.forwards if self.host is not None else 0,
                "moves": self.moves, "problem": self.problem,
                "offers": [[o.peer, o.start, o.end] for o in self.servers()],
                "missing": [list(r) for r in self.missing()], **self.fetched}

    def routes(self) -> list[Any]:
        from node.inference.api import inference_routes

        return inference_routes(self)

