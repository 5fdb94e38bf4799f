"""The one aiohttp server of a host, assembled from what plugins contribute."""
