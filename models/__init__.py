"""Base models: the registry, offline conversion of the embedded default, tiny random models for tests."""
