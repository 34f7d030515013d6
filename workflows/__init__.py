"""Workflows over the other layers: the pipeline (collect -> build -> train -> eval -> report), the flywheel and
trace harvesting."""
