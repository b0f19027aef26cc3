"""The node daemon's HTTP API: REST /v1, the web dashboard and /metrics."""
