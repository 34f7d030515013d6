"""Models (registry, tiny test models), LoRA training and offline model evaluation."""
