"""gyre_store."""
