"""Engines (vLLM, OpenAI client, transformers+peft), the planning loop, evaluation and reports."""
