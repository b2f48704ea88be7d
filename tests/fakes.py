"""Small in-memory fakes of mirrorflow's own interfaces, for tests that run without clusters."""

from __future__ import annotations

import pytest

from mirror_core import stops


class FakeBoard:
    """An in-memory :class:`mirror_core.stops.Board`: one per destination cluster alias, kept across calls as the
    topic would be. ``down`` makes it answer like a cluster that does not."""

    def __init__(self) -> None:
        self.stops: dict[str, str] = {}
        self.down = False
        self.writes = 0

    def read(self) -> dict[str, str]:
        if self.down:
            raise stops.StopSignalError("cannot read the failover stops from topic mirrorflow-stops.internal on b: "
                                        "Local: All broker connections are down")
        return dict(self.stops)

    def put(self, key: str, reason: str | None) -> None:
        if self.down:
            raise stops.StopSignalError("cannot write to topic mirrorflow-stops.internal on a: Local: Broker "
                                        "transport failure")
        self.writes += 1
        if reason is None:
            self.stops.pop(key, None)
        else:
            self.stops[key] = reason

    def close(self) -> None:
        pass


def fake_boards(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeBoard]:
    """The clusters' stops topics, by alias (``stops.board`` answers with these)."""
    by_alias: dict[str, FakeBoard] = {}
    monkeypatch.setattr(stops, "board", lambda cfg, group: by_alias.setdefault(group.destination, FakeBoard()))
    return by_alias
