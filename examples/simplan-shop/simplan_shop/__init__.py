"""simplan-shop: an example plugin environment for simplan (see simplan_shop/env.py)."""
