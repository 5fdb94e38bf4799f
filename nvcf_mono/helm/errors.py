"""The one error the Helm renderer raises: its message says what is wrong with the chart or the setup."""

from __future__ import annotations

from nvcf_mono.errors import NvcfMonoError


class HelmRenderError(NvcfMonoError):
    """A chart could not be fetched or rendered (or no renderer can run here); the message says why."""
