"""Stored responses for ``store`` / ``previous_response_id``: a bounded in-memory LRU.

Each entry is the response object (what ``GET /v1/responses/{id}`` returns) and the
conversation it ended (earlier responses' turns, this request's input, the answer), which a
request naming it as ``previous_response_id`` continues. The least recently used entry is
evicted beyond ``limits.max_stored_responses``; only the HTTP handlers touch it, all on the
event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs

from ...messages import ChatMessage


@attrs.frozen(kw_only=True)
class StoredResponse:
    response: dict[str, Any]
    #: Every turn but the instructions, ending with the assistant's answer.
    conversation: tuple[ChatMessage, ...]


class ResponseStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
