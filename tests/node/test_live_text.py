"""Following a k=1 task's streamed text (node/market/live_text.py): each growth once, in
order, until the task is over; the text by hex id for ``GET /tasks/{id}``."""

from __future__ import annotations

import trio
import trio.testing

from node.market.live_text import LiveTexts

TID = b"\x01" * 32


def test_a_follower_gets_each_growth_and_ends_with_the_task() -> None:
    state = {"text": None, "over": False}
    live = LiveTexts(lambda tid: state["text"] if tid == TID else None,  # type: ignore[arg-type,return-value]
                     lambda tid: bool(state["over"]))
    seen: list[str] = []

    async def follow() -> None:
        async for text in live.follow(TID):
            seen.append(text)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.testing.wait_all_tasks_blocked()
            for text in ("One", "One, two", "One, two"):  # no growth: nothing new
                state["text"] = text
                live.poke(TID)
                await trio.testing.wait_all_tasks_blocked()
            state["over"] = True
            live.poke(TID)

    trio.run(main)
    assert seen == ["One", "One, two"]
    assert live.text(TID.hex()) == "One, two" and live.text("not hex") is None
    assert live.text((b"\x02" * 32).hex()) is None


def test_a_follower_sees_the_text_restart_when_its_executor_failed() -> None:
    """The failed executor's text is discarded ("" at once), then the replacement's grows from
    the start: none of it extends what the follower had."""
    state = {"text": None, "over": False}
    live = LiveTexts(lambda tid: state["text"],  # type: ignore[arg-type,return-value]
                     lambda tid: bool(state["over"]))
    seen: list[str] = []

    async def follow() -> None:
        async for text in live.follow(TID):
            seen.append(text)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.testing.wait_all_tasks_blocked()
            for text in ("Four", "Four tim", None, "The", "The answer"):
                state["text"] = text
                live.poke(TID)
                await trio.testing.wait_all_tasks_blocked()
            state["over"] = True
            live.poke(TID)

    trio.run(main)
    assert seen == ["Four", "Four tim", "", "The", "The answer"]
