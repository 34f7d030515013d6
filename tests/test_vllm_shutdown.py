"""A terminated process stops what it started: vLLM's engine core, a `start_server` server.

    .venv/bin/pytest -q tests/test_vllm_shutdown.py -m "not slow"   # the signal handling (seconds)
    .venv/bin/pytest -q tests/test_vllm_shutdown.py                 # + a real vLLM engine (~2 starts)

Each case runs a script in its own session (so every process it starts can be found by session id and,
whatever happens, killed by the test), waits for it to print "ready", signals only the script itself (as
`kill PID` or `timeout` would), and checks that the script exited with the signal's status and left no
process of its session behind. Without inference/engines/termination.py a SIGTERM skipped vLLM's exit-time
shutdown and left `VLLM::EngineCore` running at ~190% CPU.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds processes by session in /proc")


def session_members(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session `sid` (zombies excluded: they hold nothing)."""
    members = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != sid or (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            members[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, IndexError):  # gone meanwhile
            continue
    return members


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def run_and_signal(
    tmp_path: Path, script: str, args: list[str], sig: signal.Signals, ready_timeout: float
) -> tuple[int, dict[int, str], dict[int, str], str]:
    """Run `script` in its own session, send `sig` to it once it prints "ready".

    Returns its exit status, the session's other processes just before the signal, those still alive
    afterwards (given a few seconds for vLLM's 5 s shutdown grace), and its output. Anything left of the
    session is then killed, so a failing case leaves no stray processes either.
    """
    path, log_path = tmp_path / "script.py", tmp_path / "script.log"
    path.write_text(textwrap.dedent(script))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(path), *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        started = wait_until(lambda: "ready" in log_path.read_text() or proc.poll() is not None, ready_timeout)
        assert started and proc.poll() is None, f"script did not get ready:\n{log_path.read_text()[-3000:]}"
        before = {pid: cmd for pid, cmd in session_members(proc.pid).items() if pid != proc.pid}
        proc.send_signal(sig)
        code = proc.wait(60)
        wait_until(lambda: not session_members(proc.pid), 20)
        return code, before, session_members(proc.pid), log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in session_members(proc.pid):  # only processes of the session this test created
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ------------------------------------------------------------------------------------- the signal handling
CHILD_SCRIPT = """
    import atexit, subprocess, sys, time
    from simplan.inference.engines.termination import exit_on_termination

    exit_on_termination()
    child = subprocess.Popen(["sleep", "120"], start_new_session=False)
    atexit.register(child.terminate)  # what vLLM's finalizers do for its engine core
    print("ready", flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_termination_signal_runs_atexit_and_exits_with_its_status(tmp_path, sig):
    code, before, left, log = run_and_signal(tmp_path, CHILD_SCRIPT, [], sig, ready_timeout=60)
    assert any("sleep 120" in cmd for cmd in before.values())
    assert code == 128 + sig, log
    assert left == {}, f"left running after {sig.name}: {left}"
    assert "Traceback" not in log  # SystemExit exits quietly


def test_handlers_already_set_are_kept_and_threads_change_nothing():
    from simplan.inference.engines.termination import exit_on_termination

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:

        def mine(signum, frame):
            pass

        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
        assert exit_on_termination() == []
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        result = []
        worker = threading.Thread(target=lambda: result.append(exit_on_termination()))
        worker.start()
        worker.join()
        assert result == [[]] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        assert exit_on_termination() == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, mine)
        assert exit_on_termination() == []  # a second call changes nothing
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


SERVER_SCRIPT = """
    import sys, time
    from simplan.inference.serving import server as serve

    serve.server_command = lambda cfg, model_path: ["sleep", "120"]  # stands in for the vLLM server
    serve.start_server(serve.ServeConfig(model=sys.argv[1]), wait=False)
    print("ready", flush=True)
    time.sleep(120)
"""


def test_terminated_caller_stops_its_server(tmp_path):
    """The server runs in a session of its own, so only our atexit `stop_all_servers` can stop it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    servers_before = set(_sleepers())
    try:
        code, _, left, log = run_and_signal(tmp_path, SERVER_SCRIPT, [str(model)], signal.SIGTERM, ready_timeout=60)
        assert code == 128 + signal.SIGTERM, log
        assert left == {}
        assert wait_until(lambda: not set(_sleepers()) - servers_before, 10), "the server outlived its caller"
    finally:
        for pid in set(_sleepers()) - servers_before:
            os.kill(pid, signal.SIGKILL)


def _sleepers() -> list[int]:
    """`sleep 120` processes of this user (the stand-in servers run in sessions of their own)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == os.getuid():
                if (entry / "cmdline").read_bytes() == b"sleep\x00120\x00":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


# --------------------------------------------------------------------------------------------- real vLLM
VLLM_SCRIPT = """
    import sys, time
    from simplan.inference.engines import make_engine

    if __name__ == "__main__":  # vLLM's engine core re-imports __main__
        engine = make_engine(
            "vllm", sys.argv[1], dtype="float32", kv_cache_gib=1, threads=1, enforce_eager=True, max_model_len=256
        )
        print("ready", flush=True)
        time.sleep(300)
"""


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signalled_vllm_engine_leaves_no_engine_core(tmp_path, sig):
    """SIGTERM: exits 143 through vLLM's own shutdown. SIGINT (kill -INT, not a terminal's Ctrl-C, which
    reaches the engine core too): Python's KeyboardInterrupt already unwinds; checked so it stays that way."""
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    from simplan.models.tiny import tiny_model

    base = str(tiny_model("llama", final_norm=1.0))
    code, before, left, log = run_and_signal(tmp_path, VLLM_SCRIPT, [base], sig, ready_timeout=420)
    assert any("VLLM::" in cmd for cmd in before.values()), f"no engine core was running: {before}"
    assert left == {}, f"left running after {sig.name}: {left}\n{log[-3000:]}"
    assert code == (128 + sig if sig == signal.SIGTERM else -sig), log[-3000:]
