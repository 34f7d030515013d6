"""Environments: the protocol (base.py), the registry, adapters and the checker."""
