"""The errors a serving loop catches (no jax import: config.py raises them too)."""

from __future__ import annotations


class RequestError(ValueError):
    """A bad request - its prompt, its sampling values, its id - refused at the call that made
    it; other requests are never affected. Every mistake a request can make raises this (or a
    subclass), so one `except RequestError` in a serving loop covers user input."""
