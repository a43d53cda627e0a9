"""Helpers shared by several test folders (test modules import from here, never from each other)."""
