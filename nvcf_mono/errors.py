"""The root of the errors nvcf_mono raises on purpose."""


class NvcfMonoError(Exception):
    """Base class of every error the platform raises deliberately."""
