"""Errors raised by the graph passes."""


class DiscoveryError(ValueError):
    """The model's graph holds a block pattern the discovery pass cannot map (named in the message)."""
