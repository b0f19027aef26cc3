"""Trace loaders, replay engine, metrics, plots."""
