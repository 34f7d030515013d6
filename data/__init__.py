"""Trajectories (schema, collection, validation), the prompt format, and dataset building."""
