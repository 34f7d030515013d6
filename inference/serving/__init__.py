"""Serving base + adapters over HTTP (vLLM's OpenAI-compatible server behind an API key); depends on the engines
alone."""
