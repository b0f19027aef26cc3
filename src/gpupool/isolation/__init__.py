"""Turns an allocation into a launch spec; MPS control; locates the native libraries."""
