"""The node daemon's core: store, queue, admission, launcher, supervisor, recovery."""
