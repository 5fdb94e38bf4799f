"""Placeholder: filled in by the control-plane work."""

from __future__ import annotations

from nvcf_mono.http.api import ApiRouter
from nvcf_mono.planes.control.context import Control


def register(router: ApiRouter, ctl: Control) -> None:
    """Add this module's endpoints."""
