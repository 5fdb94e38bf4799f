"""nvcf_mono: a serverless GPU function platform in the shape of NVIDIA Cloud Functions."""

__version__ = "0.1.0"
