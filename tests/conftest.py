"""Shared test fixtures. Tests run on the CPU in seconds; slow ones carry the `slow` marker."""

from __future__ import annotations

import os

# Tests must not oversubscribe the 2 cores (torch + JVM + vLLM workers spin threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
