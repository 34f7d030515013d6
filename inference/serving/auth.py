"""An API key on every endpoint of `simplan serve`: an ASGI middleware that vLLM loads with `--middleware`.

    SIMPLAN_SERVER_API_KEY=KEY python -m vllm.entrypoints.openai.api_server ... \\
        --middleware simplan.inference.serving.auth.BearerKeyMiddleware

vLLM's own `--api-key` check guards only the paths under /v1, /v2, /inference and /cohere (vLLM
0.32, vllm/entrypoints/serve/middleware/authenticate.py): /invocations answers generations and
/tokenize, /metrics, /health answer anyone. This middleware wraps the whole app instead, so every
HTTP request and websocket needs `Authorization: Bearer KEY`; the rest get 401 (websockets are
closed with 1008, policy violation). CORS preflight (OPTIONS) is refused too: our clients are
programs that send the key, not browsers.

vLLM builds the middleware with the app as its only argument, so the key comes from the server
process's environment (`KEY_ENV`), which `inference/serve.start_server` sets: on the command line
`ps` would show it to every user of the machine.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # starlette comes with vLLM; serve.py imports the names below without it
    from starlette.types import ASGIApp, Receive, Scope, Send

KEY_ENV = "SIMPLAN_SERVER_API_KEY"
IMPORT_PATH = "simplan.inference.serving.auth.BearerKeyMiddleware"


class BearerKeyMiddleware:
    """Answers 401 to any HTTP request (and closes any websocket) without `Authorization: Bearer KEY`."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        key = key if key is not None else os.environ.get(KEY_ENV, "")
        if not key:
            # Refuse to build the app: a server that was asked for a key must never run open.
            raise RuntimeError(f"{IMPORT_PATH}: no API key; set ${KEY_ENV} in the server's environment")
        self.app = app
        self._digest = _digest(key)

    def authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                # Compare digests in constant time: the key's length and prefix do not leak through timing.
                return scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()), self._digest)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.authorized(scope):
            await self.app(scope, receive, send)  # lifespan events, and requests with the key
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong API key"})
        else:
            await _unauthorized(send)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


async def _unauthorized(send: Send) -> None:
    # The OpenAI error shape, so OpenAI clients report it as an authentication error.
    error: dict[str, Any] = {
        "message": "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
        "type": "invalid_request_error",
        "code": 401,
    }
    body = json.dumps({"error": error}).encode("utf-8")
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"www-authenticate", b"Bearer"),
    ]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
