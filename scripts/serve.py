"""`simplan serve`: vLLM's OpenAI-compatible server with the base model and the LoRA adapters by name.

    simplan serve --model smollm2-135m-instruct --adapters decider=runs/decider,simulator=runs/sim
    simplan serve --config recipes/serve.yaml --port 8001 --api-key KEY

Prints the URL once /health answers, and stops the server cleanly on Ctrl-C or SIGTERM. Clients:
`make_engine("openai", MODEL, ["decider", "simulator"], base_url=URL, api_key=KEY)` (inference/engines).
With --api-key (or $SIMPLAN_API_KEY) every endpoint, /health included, needs `Authorization: Bearer
KEY`; a --host beyond loopback (e.g. 0.0.0.0) without a key is refused unless --insecure true.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.inference.serving.server import ServeConfig, serve_forever


def main(argv: list[str] | None = None) -> int:
    (cfg,) = parse_config([ServeConfig], argv, description=__doc__.split("\n")[0], prog="simplan serve")
    return serve_forever(cfg)


if __name__ == "__main__":
    sys.exit(main())
