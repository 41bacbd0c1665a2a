"""Runnable examples: `python -m jaxcraft.examples.<name>`."""
