"""The OpenAI-compatible LLM gateway: ``/v1/chat/completions`` and friends over the durable invocation path."""
