"""CacheManagerActor: the prefix store's owner, consulted once per admission, commit and release.

This version keeps no blocks: every lookup is a miss. It still speaks the full protocol
(lookup -> match, commit, release) and keeps its counters, so the paged prefix cache slots in
behind the same messages without reshaping the scheduler or the executor.
"""

from __future__ import annotations

from typing import assert_never

import attrs
import trio

from ..messages import CacheCommand, PrefixCommit, PrefixLookup, PrefixMatch, PrefixRelease


@attrs.frozen(slots=True, kw_only=True)
class CacheStatistics:
    """Counters since start."""

    num_queries: int
    num_hits: int
    num_misses: int
    num_commits: int
    num_releases: int
    num_leased: int


class CacheManagerActor:
    """Answers each :class:`PrefixLookup` with a :class:`PrefixMatch`, in order."""

    def __init__(
        self,
        *,
        command_recv: trio.MemoryReceiveChannel[CacheCommand],
        match_send: trio.MemorySendChannel[PrefixMatch],
    ):
        self._command_recv = command_recv
        self._match_send = match_send
        self._leased: set[str] = set()
        self._num_queries = 0
        self._num_hits = 0
        self._num_commits = 0
        self._num_releases = 0

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            num_queries=self._num_queries,
            num_hits=self._num_hits,
            num_misses=self._num_queries - self._num_hits,
            num_commits=self._num_commits,
            num_releases=self._num_releases,
            num_leased=len(self._leased),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve commands until the scheduler closes its end."""
        with self._command_recv, self._match_send:
            task_status.started()
            async for command in self._command_recv:
                await self._handle(command)

    async def _handle(self, command: CacheCommand) -> None:
        match command:
            case PrefixLookup():
                self._num_queries += 1
                self._leased.add(command.request_id)
                await self._match_send.send(
                    PrefixMatch(request_id=command.request_id, num_cached_tokens=0, block_ids=())
                )
            case PrefixCommit():
                self._num_commits += 1
            case PrefixRelease():
                for request_id in command.request_ids:
                    if request_id in self._leased:
                        self._leased.discard(request_id)
                        self._num_releases += 1
            case _:
                assert_never(command)
