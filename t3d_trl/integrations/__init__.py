"""Integrations with other evaluation and training tools (import a module to register it)."""
