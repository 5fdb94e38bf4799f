"""Helpers for testing nvcf-mono and its plugins against real processes (no mocks of NATS)."""
