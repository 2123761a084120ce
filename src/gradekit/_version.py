"""The version, one literal: pyproject.toml reads it at build time (no import-time metadata look-up)."""

__version__ = "0.2.0"
