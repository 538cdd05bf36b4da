"""Finding this node's accelerators: the backend interface and the inventory it builds."""

from hcsd.discovery.backend import DiscoveryBackend, DiscoveryError, Inventory, discover_all

__all__ = ["DiscoveryBackend", "DiscoveryError", "Inventory", "discover_all"]
