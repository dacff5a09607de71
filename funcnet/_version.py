"""funcnet's version, in a module of its own so that any module can read it without a cycle."""

__all__ = ["__version__"]

__version__ = "0.2.0.dev0"
"""funcnet's version, a PEP 440 string."""
