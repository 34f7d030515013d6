"""Engines (transformers+peft, vLLM, an OpenAI-compatible client) behind one protocol, and serving them."""
