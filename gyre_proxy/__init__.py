"""gyre_proxy."""
