"""HTTP client of the agentbolt server (agent side: aiohttp, no torch): async and blocking forms."""

from agentbolt.client.http_store import HttpLightningStore
from agentbolt.client.sync_store import SyncHttpLightningStore

__all__ = ["HttpLightningStore", "SyncHttpLightningStore"]
