"""The node daemon's HTTP side: the FastAPI app (REST /v1), its server, and the client."""
