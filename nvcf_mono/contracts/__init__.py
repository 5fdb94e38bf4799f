"""Everything that crosses a plane boundary: subjects, streams, consumers, buckets, payloads, env.

Planes never import each other; they agree on these definitions instead. ``README.md`` in this
folder is the table of who produces and who consumes each one. Stream, bucket and subject literals
live here only (a contract test fails on one written anywhere else).
"""
