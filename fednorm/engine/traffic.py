"""What a role put on and took off the wire, counted by its :class:`~fednorm.engine.
runtime.RoleContext`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrafficStats:
    """What one role put on and took off the wire."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    rounds: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def count_sent(self, kind: str, size: int) -> None:
        self.bytes_sent += size
        self.messages_sent += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + size

    def count_received(self, size: int) -> None:
        self.bytes_received += size
        self.messages_received += 1
