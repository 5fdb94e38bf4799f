"""Domain values shared by the planes: attrs-frozen, camelCase on the wire, stored in KV as they are."""
