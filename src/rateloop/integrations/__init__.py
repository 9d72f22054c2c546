"""Integrations where users already are: SDK clients, httpx transports."""
