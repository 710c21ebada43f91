"""HTTP client of the agentbolt server (agent side: httpx only, no torch)."""

from agentbolt.client.http_store import HttpLightningStore

__all__ = ["HttpLightningStore"]
