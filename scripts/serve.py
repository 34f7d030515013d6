"""`simplan serve`: vLLM's OpenAI-compatible server with the base model and the LoRA adapters by name.

    simplan serve --model smollm2-135m-instruct --adapters decider=runs/decider,simulator=runs/sim
    SIMPLAN_API_KEY=KEY simplan serve --config recipes/serve.yaml --port 8001

Prints the URL once /health answers, and stops the server cleanly on Ctrl-C or SIGTERM. Clients:
`make_engine("openai", MODEL, ["decider", "simulator"], base_url=URL, api_key=KEY)` (inference/engines).
With --api-key (or $SIMPLAN_API_KEY) every endpoint, /health included, needs `Authorization: Bearer
KEY`; a --host beyond loopback (e.g. 0.0.0.0) without a key is refused unless --insecure true. Prefer the
environment variable: a key on the command line is shown by `ps` to every account on the machine (and kept in
the shell's history), which the command warns about.
"""

from __future__ import annotations

import sys

from simplan.core.config import parse_config
from simplan.inference.serving.server import ServeConfig, serve_forever

KEY_FLAGS = ("--api-key", "--api_key")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in KEY_FLAGS or a.startswith(tuple(f"{f}=" for f in KEY_FLAGS)) for a in args):
        print(
            "simplan serve: warning: --api-key on the command line is visible to every account on this machine "
            "(`ps`) and stays in the shell's history; export SIMPLAN_API_KEY=KEY instead",
            file=sys.stderr,
            flush=True,
        )
    (cfg,) = parse_config([ServeConfig], argv, description=__doc__.split("\n")[0], prog="simplan serve")
    return serve_forever(cfg)


if __name__ == "__main__":
    sys.exit(main())
