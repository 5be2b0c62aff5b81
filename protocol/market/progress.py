"""Token streaming of k=1 tasks: unsigned progress frames from the executor, judged later.

A k=1 task has no vote to wait for, so its executor sends the text it has generated so far
as it goes: ``Progress`` frames (tag 53) on the authenticated direct stream to the requester,
each carrying the next piece of the text (``seq`` counts frames from 0), when the assignment
asks for them (``AssignBody.stream``: someone follows the text; an ask that waits for the
whole answer does not, and spares the executor's cores the frames). They are unsigned
and prove nothing: verification and the ledger judge only the signed ``Result``. What they
promise is checked once that result is in: the streamed text must be a prefix of the signed
chain of thought (the text the executor generated), else the executor streamed something it
did not sign, which costs it ``PENALTY_STREAM_LIE`` like any other bad input.

Both sides bound the frames like any other input: at most ``MAX_PROGRESS_FRAMES`` per task,
``MAX_PROGRESS_CHARS`` characters (``MAX_PROGRESS_BYTES`` UTF-8 bytes) per frame and
``MAX_PROGRESS_TOTAL`` bytes in all, only from the executor assigned that task and attempt,
in order. The requester (:class:`ProgressBook`) drops anything else and penalizes the sender
``PENALTY_PROGRESS``; a frame from the assigned executor that arrives after its attempt ended
(it crossed the result or a cancel on the wire) is dropped without a penalty. An attempt that
fails mid-stream (timeout, reject, a failed check) is replaced by another executor's, which
streams its own text from the start: the failed attempt's text is discarded (``discard``), so
what a follower sees next does not extend what it saw, and that is how it learns that the
stream restarted (``Streamed`` and a ``task.stream_restarted`` event say so). The executor
(:class:`ProgressSender`) only sends what keeps its stream a prefix of its own text, and stops
streaming at the bounds (the rest arrives with the result).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.codec import Message, limits, message
from protocol.machine import Effect, Emit, Penalize, Send
from protocol.market.jobs import Job, JobState
from protocol.market.messages import COT_TRUNCATION_MARK, MAX_ATTEMPT, MAX_COT_CHARS, TASK_ID_LEN
from protocol.market.state import AttemptState, OpenTask

MAX_PROGRESS_FRAMES = 1_024
MAX_PROGRESS_CHARS = 1_024
MAX_PROGRESS_BYTES = 4 * MAX_PROGRESS_CHARS
#: the streamed text of one attempt, in UTF-8 bytes (no more than a CoT may hold)
MAX_PROGRESS_TOTAL = MAX_COT_CHARS
#: a frame nobody asked for (another task, attempt or sender, out of order, over the bounds)
PENALTY_PROGRESS = 5
#: a stream the signed result contradicts
PENALTY_STREAM_LIE = 20


@message(53)
@dataclass(frozen=True, slots=True, kw_only=True)
class Progress(Message):
    """The next piece of a k=1 task's text, executor -> requester, unsigned."""

    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    seq: int = limits(lo=0, hi=MAX_PROGRESS_FRAMES - 1)
    text: str = limits(max_len=MAX_PROGRESS_CHARS)


@dataclass(frozen=True, slots=True)
class ComputeProgress:
    """From the executor's driver: the text ``attempt`` of ``task_id`` has generated so far."""

    task_id: bytes
    attempt: int
    text: str


@dataclass(frozen=True, slots=True)
class Streamed:
    """Effect of the requester's machine: ``task_id``'s streamed text has changed (the driver
    wakes whoever follows it): it grew, or the attempt streaming it failed and its text was
    discarded (what follows it next does not extend it)."""

    task_id: bytes


@dataclass(slots=True)
class _Stream:
    text: str = ""
    frames: int = 0
    size: int = 0  # UTF-8 bytes of text


def _fits(stream: _Stream, piece: str) -> bool:
    return (stream.frames < MAX_PROGRESS_FRAMES
            and stream.size + len(piece.encode()) <= MAX_PROGRESS_TOTAL)


class ProgressSender:
    """The executor's side: turns the growing text of a running k=1 job into frames."""

    def __init__(self) -> None:
        self.streams: dict[tuple[bytes, int], _Stream] = {}

    def frame(self, jobs: Mapping[bytes, Job], ev: ComputeProgress) -> list[Effect]:
        """The frame carrying what ``ev.text`` adds to what was sent (none: not a running
        k=1 job whose assignment asks for its text, nothing new, a text that no longer extends
        what was sent, or the bounds)."""
        job = jobs.get(ev.task_id)
        key = (ev.task_id, ev.attempt)
        for old in [k for k in self.streams if k != key]:  # a job that is over: forget it
            other = jobs.get(old[0])
            if other is None or other.state is not JobState.RUNNING or other.attempt != old[1]:
                del self.streams[old]
        if (job is None or job.state is not JobState.RUNNING or job.attempt != ev.attempt
                or job.task is None or job.task.k != 1 or not job.stream):
            return []
        stream = self.streams.setdefault(key, _Stream())
        if not ev.text.startswith(stream.text) or len(ev.text) == len(stream.text):
            return []
        piece = ev.text[len(stream.text):][:MAX_PROGRESS_CHARS]
        if not _fits(stream, piece):
            return []
        msg = Progress(task_id=ev.task_id, attempt=ev.attempt, seq=stream.frames, text=piece)
        stream.text += piece
        stream.frames += 1
        stream.size += len(piece.encode())
        return [Send(job.requester, msg)]


@dataclass(slots=True)
class ProgressBook:
    """The requester's side: the text each assigned k=1 attempt has streamed, and its judge."""

    streams: dict[tuple[bytes, int], _Stream] = field(default_factory=dict)
    #: task id -> the attempt whose stream is followed (the latest accepted frame's)
    latest: dict[bytes, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def _drop(self, peer: str, why: str) -> list[Effect]:
        self.counters[f"progress_dropped.{why}"] = self.counters.get(
            f"progress_dropped.{why}", 0) + 1
        return [Penalize(peer, f"progress frame: {why}", PENALTY_PROGRESS)]

    def accept(self, peer: str, msg: Progress, tasks: Mapping[bytes, OpenTask]) -> list[Effect]:
        """Take ``msg`` from ``peer`` if it is the next frame of its assigned attempt."""
        task = tasks.get(msg.task_id)
        attempt = task.attempts.get(msg.attempt) if task is not None else None
        if task is None or attempt is None or attempt.peer != peer:
            return self._drop(peer, "not_assigned")
        if task.spec.k != 1:
            return self._drop(peer, "voted_task")
        if task.finished or attempt.state is not AttemptState.ASSIGNED:
            self.counters["progress_late"] = self.counters.get("progress_late", 0) + 1
            return []  # crossed the result or a cancel on the wire
        stream = self.streams.setdefault((msg.task_id, msg.attempt), _Stream())
        if msg.seq != stream.frames:
            return self._drop(peer, "out_of_order")
        if len(msg.text.encode()) > MAX_PROGRESS_BYTES or not _fits(stream, msg.text):
            return self._drop(peer, "over_bounds")
        stream.text += msg.text
        stream.frames += 1
        stream.size += len(msg.text.encode())
        self.counters["progress_frames"] = self.counters.get("progress_frames", 0) + 1
        self.latest[msg.task_id] = msg.attempt
        return [Streamed(msg.task_id)]

    def text(self, task_id: bytes) -> str | None:
        """What the followed attempt of ``task_id`` has streamed (None: nothing yet)."""
        attempt = self.latest.get(task_id)
        stream = self.streams.get((task_id, attempt)) if attempt is not None else None
        return None if stream is None else stream.text

    def judge(self, task_id: bytes, executor: str, attempt: int, cot: str) -> list[Effect]:
        """Check the signed result of ``attempt`` (its ``cot``, from ``executor``) against
        what the attempt streamed: a stream that is not a prefix of the signed text is the
        executor's fault. The text stays until the task is forgotten: followers still reading
        it must not see it vanish (that is how a discarded, failed attempt's text looks)."""
        stream = self.streams.get((task_id, attempt))
        if stream is None or agrees(stream.text, cot):
            return []
        self.counters["stream_lies"] = self.counters.get("stream_lies", 0) + 1
        return [Penalize(executor, "streamed text the signed result contradicts",
                         PENALTY_STREAM_LIE),
                Emit("task.stream_contradicted", {"task_id": task_id.hex(), "peer": executor})]

    def discard(self, task_id: bytes, attempt: int) -> list[Effect]:
        """``attempt`` failed: drop what it streamed. If it was the followed stream, the
        task's text is gone until the replacement streams (followers are woken to see it)."""
        stream = self.streams.pop((task_id, attempt), None)
        if self.latest.get(task_id) != attempt:
            return []
        del self.latest[task_id]
        self.counters["progress_restarted"] = self.counters.get("progress_restarted", 0) + 1
        dropped = len(stream.text) if stream is not None else 0
        return [Streamed(task_id), Emit("task.stream_restarted", {
            "task_id": task_id.hex(), "attempt": attempt, "discarded_chars": dropped})]

    def forget(self, task_id: bytes) -> None:
        self.latest.pop(task_id, None)
        for key in [k for k in self.streams if k[0] == task_id]:
            del self.streams[key]


def agrees(streamed: str, cot: str) -> bool:
    """Whether ``streamed`` is a prefix of the signed ``cot`` (of what it kept, when the
    executor truncated it)."""
    if cot.startswith(streamed):
        return True
    if cot.endswith(COT_TRUNCATION_MARK):
        kept = cot[:-len(COT_TRUNCATION_MARK)]
        return streamed.startswith(kept)
    return False
