"""Units, resource and request types, errors: pure, no I/O, no third-party imports."""
