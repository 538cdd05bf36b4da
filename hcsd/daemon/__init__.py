"""The hcsd process: its life cycle, configuration, logging, metrics and the wiring of the parts."""
