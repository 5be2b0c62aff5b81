"""The executor's token pump (node/market/text_pump.py): one progress frame in flight at a
time, the text generated meanwhile coalesced into the next."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.market.text_pump import TextPump


def test_the_next_frame_waits_for_the_last_to_leave_and_carries_all_new_text() -> None:
    async def main() -> None:
        sent: list[str] = []
        left = trio.Event()  # the outbox to the requester has delivered what it held
        waits = 0

        async def send(text: str) -> None:
            sent.append(text)

        async def drained() -> None:
            nonlocal waits
            waits += 1
            await left.wait()

        pump = TextPump()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.follow, send, drained)
            pump.push("The")
            await trio.testing.wait_all_tasks_blocked()
            assert sent == ["The"] and waits == 1
            for text in ("The answer", "The answer is", "The answer is 42"):
                pump.push(text)  # the first frame is still on its way: nothing more is sent
                await trio.testing.wait_all_tasks_blocked()
            assert sent == ["The"]
            left.set()
            await trio.sleep(1)  # past the pacing interval (mock clock)
            assert sent == ["The", "The answer is 42"]  # one frame for the three pushes
            pump.push("The answer is 42.")
            await trio.sleep(1)
            assert sent[-1] == "The answer is 42." and len(sent) == 3
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_executor_streaming_many_tasks_paces_each_by_their_number() -> None:
    from node.market.text_pump import PROGRESS_INTERVAL_S, shared_gap

    assert shared_gap(0) == shared_gap(1) == PROGRESS_INTERVAL_S
    assert shared_gap(16) == 16 * PROGRESS_INTERVAL_S

    async def main() -> None:
        sent: list[tuple[float, str]] = []
        streams = 4

        async def send(text: str) -> None:
            sent.append((trio.current_time(), text))

        async def drained() -> None:
            pass

        pump = TextPump(lambda: shared_gap(streams))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.follow, send, drained)
            pump.push("a")
            await trio.testing.wait_all_tasks_blocked()
            pump.push("ab")  # within the gap of four streams: held back, then sent whole
            await trio.sleep(3 * PROGRESS_INTERVAL_S)
            assert [t for _, t in sent] == ["a"]
            await trio.sleep(2 * PROGRESS_INTERVAL_S)
            assert [t for _, t in sent] == ["a", "ab"]
            assert sent[1][0] - sent[0][0] == pytest.approx(4 * PROGRESS_INTERVAL_S)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
