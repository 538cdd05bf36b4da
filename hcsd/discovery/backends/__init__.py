"""Discovery backends, one module per source; they never import each other."""
