"""What every layer may use: config loading (dataclasses <-> YAML and flags), atomic file IO, text matching."""
