"""The hcsd process: configuration, logging, metrics, supervision and the main entry point."""
