"""Reference models written with funcnet's layers: short enough to read, tested against
the code they follow."""

from funcnet.models.gpt import GPT

__all__ = ["GPT"]
