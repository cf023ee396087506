"""The one list-and-watch loop: a local view of some objects that survives the API server.

A list gives the objects and the resourceVersion to watch from; the watch then reports each
change after it, and every event (a bookmark too) moves that version on, so a watch the server
ends (its timeout) continues where it stopped. A watch too old to continue (410, `expired`)
lists again at once: the list reports everything as it is now, so nothing the lost watch missed
stays missed. Any other failure that `KEPT_TRYING` names (a TransientFault, of the list too, or
the server's final answer) waits the shared backoff, longer after each failure in a row and from
the start again once an event arrives; anything else ends the loop.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from structlog.typing import FilteringBoundLogger

from dra_driver.base.backoff import Backoff
from dra_driver.kube.calls import WatchEvent
from dra_driver.kube.errors import KEPT_TRYING, ApiError


class WatchPosition(msgspec.Struct):
    """The resourceVersion the next watch starts from; None: list first. Its own object because a
    caller may list on its own (the slice controller, when a write's outcome is unknown) and move
    it, or find that someone listed meanwhile."""

    resource_version: str | None = None


async def list_and_watch(
    relist: Callable[[], Awaitable[str]],
    watch: Callable[[str], AsyncIterator[WatchEvent]],
    on_event: Callable[[WatchEvent], None],
    *,
    backoff: Backoff,
    log: FilteringBoundLogger,
    what: str,
    position: WatchPosition | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Until cancelled: `relist` (it takes in the listed objects, and returns the version to watch
    from) whenever `position` is None, then `watch` from it, passing each event but bookmarks to
    `on_event`. `what` names the objects in the log lines ("node watch failed; retrying")."""
    position = position or WatchPosition()
    failures = 0
    while True:
        try:
            if position.resource_version is None:
                position.resource_version = await relist()
            async for event in watch(position.resource_version):
                failures = 0
                position.resource_version = event.resource_version or position.resource_version
                if event.kind != "BOOKMARK":
                    on_event(event)
            # The server ended the watch (its timeout): go on from where it stopped.
        except KEPT_TRYING as error:  # a TransientFault (ApiError or not), or the server's final answer
            if isinstance(error, ApiError) and error.expired:
                log.info(f"{what} watch expired; listing again", error=str(error))
                position.resource_version = None
                continue
            failures += 1
            delay = backoff.delay(failures)
            log.warning(f"{what} watch failed; retrying", error=str(error), retry_in_seconds=delay)
            await sleep(delay)
