"""`simplan serve`: the API key guards every endpoint, an open server stays on loopback, and no
server outlives the process (or the pytest run) that started it. No model is loaded here; the real
server is checked in tests/test_engines.py (slow).

    .venv/bin/pytest -q tests/test_serve_auth.py
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from simplan.inference.serving import server as serve
from simplan.inference.serving.auth import IMPORT_PATH, KEY_ENV, BearerKeyMiddleware
from simplan.inference.serving.server import ServeConfig, ServerHandle, server_command, stop_all_servers

ROOT = Path(__file__).resolve().parents[1]
KEY = "s3cret-key"
# The paths vLLM 0.32's own --api-key check leaves open (/invocations generates) and two it guards.
PATHS = [("POST", "/v1/completions"), ("POST", "/invocations"), ("POST", "/tokenize"), ("GET", "/metrics")]
PATHS += [("GET", "/health"), ("GET", "/v1/models")]


async def _ok(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path})


async def _echo_ws(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.close()


def _app() -> Starlette:
    routes = [Route(path, _ok, methods=[method]) for method, path in PATHS]
    routes.append(Route("/metrics-text", lambda r: PlainTextResponse("up 1")))
    return Starlette(routes=[*routes, WebSocketRoute("/v1/realtime", _echo_ws)])


@pytest.fixture
def client(monkeypatch) -> TestClient:
    monkeypatch.setenv(KEY_ENV, KEY)
    app = _app()
    app.add_middleware(BearerKeyMiddleware)  # as vLLM adds it: the app is the only argument
    return TestClient(app)


@pytest.mark.parametrize(("method", "path"), PATHS)
def test_every_path_needs_the_key(client, method, path) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"X-Api-Key": KEY}):
        r = client.request(method, path, headers=headers)
        assert r.status_code == 401, (path, headers)
        assert "API key" in r.json()["error"]["message"]
    r = client.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json() == {"path": path}
    assert client.request(method, path, headers={"authorization": f"bearer {KEY}"}).status_code == 200


def test_websockets_need_the_key(client) -> None:
    with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/v1/realtime"):
        pass
    assert refused.value.code == 1008
    with client.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.receive_text() == "hello"


def test_middleware_without_a_key_refuses_to_build(monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match=KEY_ENV):
        BearerKeyMiddleware(_app())


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_vllm_loads_the_middleware_from_its_option(monkeypatch) -> None:
    """vLLM's own --middleware loader (what `--middleware IMPORT_PATH` runs) guards /invocations too."""
    from argparse import Namespace

    from fastapi import FastAPI
    from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware

    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = FastAPI()
    for method, path in PATHS:
        app.add_api_route(path, _ok, methods=[method])
    args = Namespace(
        allowed_origins=["*"],
        allow_credentials=False,
        allowed_methods=["*"],
        allowed_headers=["*"],
        api_key=None,
        enable_request_id_headers=False,
        middleware=[IMPORT_PATH],
    )
    init_entrypoints_middleware(args, app, ("generate",))
    client = TestClient(app)
    for method, path in PATHS:
        assert client.request(method, path).status_code == 401, path
        assert client.request(method, path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


# --------------------------------------------------------------------------------- host and key
def test_open_server_beyond_loopback_is_refused(monkeypatch) -> None:
    monkeypatch.delenv("SIMPLAN_API_KEY", raising=False)
    for host in ("0.0.0.0", "::", "192.168.1.20", "myhost.example"):
        with pytest.raises(ValueError, match=rf"host: {host} .*--insecure true"):
            ServeConfig(host=host)
        assert ServeConfig(host=host, api_key=KEY).resolved_api_key() == KEY
        assert ServeConfig(host=host, insecure=True).resolved_api_key() is None
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert ServeConfig(host=host).resolved_api_key() is None
    monkeypatch.setenv("SIMPLAN_API_KEY", "from-env")
    assert ServeConfig(host="0.0.0.0").resolved_api_key() == "from-env"


def test_the_key_reaches_the_server_by_environment_only(monkeypatch) -> None:
    monkeypatch.delenv("SIMPLAN_API_KEY", raising=False)
    started: dict[str, object] = {}
    real_popen = subprocess.Popen

    def fake_popen(cmd, env, **kw):
        started.update(cmd=cmd, env=env)
        return real_popen(["sleep", "30"], start_new_session=True)

    monkeypatch.setattr(serve.subprocess, "Popen", fake_popen)
    cfg = ServeConfig(model="org/tiny", host="0.0.0.0", api_key=KEY)
    with serve.start_server(cfg, wait=False) as handle:
        assert handle._api_key == KEY  # the health check sends it: /health is guarded too
    cmd, env = started["cmd"], started["env"]
    assert env[KEY_ENV] == KEY and not any(KEY in part for part in cmd)
    assert cmd[cmd.index("--middleware") + 1] == IMPORT_PATH
    assert "--middleware" not in server_command(ServeConfig(model="org/tiny"), "org/tiny")


# --------------------------------------------------------------------------------- clean-up
def _group_with_grandchild() -> tuple[subprocess.Popen, int]:
    """A stand-in server: a shell in its own process group with a child of its own (like vLLM's engine core)."""
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    return proc, int(proc.stdout.readline())


def _alive(pid: int, grace: float = 5.0) -> bool:
    """Whether `pid` still runs after `grace` seconds (a SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + grace
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _running(pid)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but not yet reaped by its parent.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_stop_all_servers_kills_each_process_group() -> None:
    proc, grandchild = _group_with_grandchild()
    handle = ServerHandle(proc, ServeConfig(), log=None)
    assert stop_all_servers(timeout=2) == 1
    assert proc.poll() is not None and not _alive(grandchild)
    assert stop_all_servers() == 0 and handle.stop() == proc.returncode  # stopping twice signals nobody


def test_a_terminated_pytest_stops_its_servers(tmp_path) -> None:
    """SIGTERM to pytest (as `timeout` sends) mid-test: conftest turns it into an interrupt, the server dies."""
    pids = tmp_path / "pids"
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        textwrap.dedent(
            f"""
            import subprocess, time
            from simplan.inference.serving.server import ServeConfig, ServerHandle

            def test_holds_a_server():
                proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                                        text=True, start_new_session=True)
                grandchild = proc.stdout.readline().strip()
                ServerHandle(proc, ServeConfig(), log=None)  # never stopped by the test itself
                open({str(pids)!r}, "w").write(f"{{proc.pid}} {{grandchild}}")
                time.sleep(60)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}  # `-p conftest` loads this repo's conftest
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(probe)]
    runner = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text()):
            assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read().decode()
            time.sleep(0.1)
        server, grandchild = map(int, pids.read_text().split())
        runner.send_signal(signal.SIGTERM)
        runner.wait(30)
        assert not _alive(server) and not _alive(grandchild)
    finally:
        if runner.poll() is None:
            runner.kill()
        for pid in map(int, pids.read_text().split()) if pids.exists() and pids.read_text() else ():
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
