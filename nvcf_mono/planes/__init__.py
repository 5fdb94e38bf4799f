"""The three planes. Each is a plugin; planes never import each other and meet only on the bus."""
