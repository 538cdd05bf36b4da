"""Device health: kernel events in, a score and a state per device out."""
