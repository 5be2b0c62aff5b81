"""The ``[inference]`` config section of the daemon (node/inference/service.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from models.device import parse_device
from protocol.inference.messages import MAX_LINK_DELAY_MS
from protocol.inference.stage_checks import DEFAULT_CHECK_RATE

#: models.dishonest.KINDS (named here: models load torch, the config check must not)
DISHONEST_KINDS = ("bf16", "coarser_quant", "skipped_layer", "noise", "replay")


@dataclass(frozen=True)
class InferenceSection:
    #: registry name, .gguf path ("" = the default model) whose blocks are served and asked for;
    #: a weights hash (64 hex digits) with ``serve_blocks = "A:B"``: a node without the file
    #: fetches the blocks' tensors from the peers that offer it (node/inference/weights.py)
    model: str = ""
    #: the model a requester's speculative chains draft with ("" = ``model`` itself): a smaller
    #: one of the same family; one with another tokenizer is refused at start
    drafter: str = ""
    #: sessions open at once on this server
    max_sessions: int = 16
    #: positions one session may hold (prompt + output + drafts)
    max_tokens_per_session: int = 2048
    #: attention-cache memory for all sessions together, MiB (reserved when a session opens);
    #: 0 = half the free memory of the device the caches live on (node/inference/cache_budget)
    max_cache_mb: int = 0
    #: a session with no request for this long is dropped
    idle_timeout_s: float = 60.0
    #: hidden states on the wire: "f16", "f32", or "auto": f16, except for model types whose
    #: hidden states overflow f16's range (F16_UNSAFE_MODEL_TYPES: Gemma's), which take f32
    precision: str = "auto"
    #: hold every outgoing session frame this long (emulated link latency; 0 = off); the
    #: chains this node asks for hold every link that long (their servers are asked to)
    link_delay_ms: float = 0.0
    #: this node's chains hand hidden states off stage to stage (N + 1 links a step), rather than
    #: the requester sending to each stage in turn (2 N)
    forwarding: bool = True
    #: peer ids this node never uses in its chains
    avoid_peers: tuple[str, ...] = ()
    #: with serve_blocks = "auto": how often coverage is re-checked
    auto_check_s: float = 30.0
    #: with serve_blocks = "auto": the most blocks to hold (0 = as many as memory and speed allow)
    auto_max_blocks: int = 0
    #: torch threads for the stage and a requester's head (0 = torch's default)
    threads: int = 0
    #: where served blocks run: "cpu" (fp32), "cuda" / "cuda:N" (fp16, bf16 for Gemma), or
    #: "auto" (the first CUDA device torch sees, else the CPU); models.blocks.resolve_device
    device: str = "cpu"
    #: a requester's speculative chains draft ahead while the chain verifies (a second drafter
    #: on a thread of its own, models.lookahead), with greedy and MARS verification
    lookahead: bool = True
    #: the fraction of each stage's steps this node's chains check (0 = no stage checks)
    check_rate: float = DEFAULT_CHECK_RATE
    #: for tests and benches only: serve the blocks dishonestly (models.dishonest.KINDS)
    dishonest: str = ""
    #: the ``noise`` kind's scale (its RMS over each row's)
    dishonest_scale: float = 0.01

    def __post_init__(self) -> None:
        if self.precision not in ("auto", "f16", "f32"):
            raise ValueError("[inference] precision must be 'auto', 'f16' or 'f32', "
                             f"got {self.precision!r}")
        for key in ("max_sessions", "max_tokens_per_session"):
            if getattr(self, key) < 1:
                raise ValueError(f"[inference] {key} must be >= 1")
        if self.max_cache_mb < 0:
            raise ValueError("[inference] max_cache_mb must be >= 0 (0: from free memory)")
        if not 0 <= self.link_delay_ms <= MAX_LINK_DELAY_MS or self.idle_timeout_s <= 0:
            raise ValueError(f"[inference] link_delay_ms must lie in [0, {MAX_LINK_DELAY_MS}] "
                             "and idle_timeout_s be > 0")
        try:
            parse_device(self.device)
        except ValueError:
            raise ValueError("[inference] device must be 'auto', 'cpu', 'cuda' or 'cuda:N', "
                             f"got {self.device!r}") from None
        if not 0.0 <= self.check_rate <= 1.0:
            raise ValueError("[inference] check_rate must lie in [0, 1]")
        if self.dishonest not in ("", *DISHONEST_KINDS):
            raise ValueError(f"[inference] dishonest must be one of {DISHONEST_KINDS}")
        if not all(isinstance(p, str) and p for p in self.avoid_peers):
            raise ValueError("[inference] avoid_peers must be a list of peer ids")
