"""typer commands: parse, call the layer below, format. No logic of their own."""
