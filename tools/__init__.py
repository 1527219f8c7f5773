"""Command-line entry points of gyre: thin wrappers over the packages, no library logic."""
