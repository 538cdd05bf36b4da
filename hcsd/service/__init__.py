"""The node as every caller sees it: `NodeService` and its change feed."""

from hcsd.service.feed import (
    WATCH_QUEUE,
    DeviceStatus,
    Event,
    EventKind,
    Subscription,
    WatchOverflow,
)
from hcsd.service.node import NodeService

__all__ = [
    "WATCH_QUEUE",
    "DeviceStatus",
    "Event",
    "EventKind",
    "NodeService",
    "Subscription",
    "WatchOverflow",
]
