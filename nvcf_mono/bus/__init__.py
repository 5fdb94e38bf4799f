"""The bus every plane talks over: NATS core, JetStream streams and consumers, KV buckets, object store."""
