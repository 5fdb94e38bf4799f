"""Cross-plane contracts: subjects, streams, buckets, payloads and the instance environment."""
