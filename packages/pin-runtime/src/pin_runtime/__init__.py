"""Shared runtime of the PIN workers."""
