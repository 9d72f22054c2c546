"""The real agent CLIs under ``rateloop run``, against a local API that always refuses (issue 27).

For each agent CLI found (Claude Code, Codex, Gemini CLI, installed from npm
into a private prefix, see below), the bench:

(a) runs the agent alone once against a local server that answers every
    request with a refusal, and counts the requests it made and the wall time;
(b) runs ``python -m rateloop run --json --max-retries N --base-delay-secs B
    --max-delay-secs M --timeout T -- <the agent's headless command>`` against
    the same kind of server, and counts the requests, rateloop's attempts and
    exit code, and checks what rateloop printed: the kind named in the
    give-up message, and that the excerpt shows the refusal.

The refusing server is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (one per
case, an ephemeral port) that answers every request, whatever its path, with

* Claude Code (``ANTHROPIC_BASE_URL``): 429 ``{"type":"error","error":{"type":
  "rate_limit_error",...}}`` or, in the overload case, 529 ``overloaded_error``;
* Codex (a custom ``model_providers.local`` with ``base_url`` and ``env_key``,
  ``-c`` overrides, ``CODEX_HOME`` private): 429 ``{"error":{"type":"requests",
  "code":"rate_limit_exceeded",...}}``;
* Gemini CLI (``GOOGLE_GEMINI_BASE_URL`` with ``GEMINI_API_KEY``): 429
  ``{"error":{"code":429,"status":"RESOURCE_EXHAUSTED",...}}``.

The cases: each agent alone and under ``rateloop run --max-retries 2``; for Claude Code also
``--output-format stream-json --verbose`` (its own retries visible as ``api_retry`` events),
both outputs with rateloop's default ``--max-retries 5``, and a 529 ``overloaded_error``
alone and under ``rateloop run``.  rateloop's waits are capped at 1 s then 2 s
(``--base-delay-secs 1 --max-delay-secs 2``) so the bench ends in minutes; ``--timeout``
(420 s) bounds each attempt, and every subprocess has a timeout.  Under ``rateloop run``
Claude Code gets the ``CLAUDE_CODE_MAX_RETRIES=2`` that rateloop sets; alone it keeps its
default (10).

No ``retry-after`` header is sent, so each agent uses its own default backoff.
Every agent runs with ``HOME`` (and its config dir) in a fresh temporary
directory, fake keys, and telemetry, error reporting, auto-update and other
nonessential traffic switched off; its only endpoint is 127.0.0.1.  All cases
run at once (each has its own server), so the bench takes as long as the
slowest agent alone (Gemini CLI, ~5 min).  Every subprocess has a timeout.

Setup (no global install; node_modules never goes into the repository)::

    npm install --prefix /tmp/agents @anthropic-ai/claude-code @google/gemini-cli @openai/codex
    PYTHONPATH=src python3 bench/real_agents.py --prefix /tmp/agents

``--only claude,codex`` limits the agents, ``--skip-alone`` skips (a),
``--save-outputs DIR`` keeps every run's stdout/stderr (the fixtures in
``tests/fixtures/agent_results.yaml`` marked "captured locally by
bench/real_agents.py" come from there).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# The refusing server
# ---------------------------------------------------------------------------------------------

REFUSALS: dict[str, tuple[int, dict[str, Any]]] = {
    "anthropic-429": (
        429,
        {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "This request would exceed your organization's rate limit of 50 "
                "requests per minute. Please try again later.",
            },
        },
    ),
    "anthropic-529": (
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ),
    "openai-429": (
        429,
        {
            "error": {
                "message": "Rate limit reached for requests on gpt-5 in organization org-local "
                "on requests per min (RPM): Limit 3, Used 3, Requested 1. "
                "Please try again later.",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        },
    ),
    "gemini-429": (
        429,
        {
            "error": {
                "code": 429,
                "message": "Resource has been exhausted (e.g. check quota).",
                "status": "RESOURCE_EXHAUSTED",
            }
        },
    ),
}


@dataclass
class Hit:
    at: float
    method: str
    path: str


class RefusingServer:
    """Answers every request on 127.0.0.1 with one refusal; records each request."""

    def __init__(self, refusal: str) -> None:
        status, body = REFUSALS[refusal]
        payload = json.dumps(body).encode()
        hits: list[Hit] = []
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _refuse(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                with lock:
                    hits.append(Hit(time.monotonic(), self.command, self.path))
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _refuse

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.hits = hits
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> RefusingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# ---------------------------------------------------------------------------------------------
# The agents
# ---------------------------------------------------------------------------------------------

QUIET_ENV = {
    # Claude Code
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    # Gemini CLI
    "GEMINI_TELEMETRY_ENABLED": "false",
    "GEMINI_CLI_NO_RELAUNCH": "true",
    "GEMINI_CLI_TRUST_WORKSPACE": "true",  # headless runs refuse an untrusted folder (exit 55)
    # everyone
    "NO_COLOR": "1",
    "CI": "1",
    "DO_NOT_TRACK": "1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}

PROMPT = "Reply with the single word: ok"


@dataclass
class Agent:
    name: str
    refusal: str
    version: str = ""

    def command(self, bin_dir: Path, url: str, output: str = "") -> list[str]:
        exe = str(bin_dir / self.name)
        if self.name == "claude":
            if output == "stream-json":
                return [exe, "-p", PROMPT, "--output-format", "stream-json", "--verbose"]
            return [exe, "-p", PROMPT, "--output-format", "json"]
        if self.name == "codex":
            provider = (
                f'model_providers.local={{name="local", base_url="{url}/v1", '
                'env_key="RATELOOP_BENCH_KEY", wire_api="responses"}'
            )
            return [
                exe, "exec", "--json", "--skip-git-repo-check",
                "-c", provider, "-c", 'model_provider="local"', "-c", 'model="gpt-5"',
                PROMPT,
            ]
        if self.name == "gemini":
            return [exe, "-p", PROMPT, "-o", "json"]
        raise ValueError(self.name)

    def env(self, home: Path, url: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "TMPDIR": str(home),
            "LANG": "C.UTF-8",
            **QUIET_ENV,
        }
        if self.name == "claude":
            env |= {
                "ANTHROPIC_BASE_URL": url,
                "ANTHROPIC_API_KEY": "sk-ant-bench-local-0000",
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            }
        elif self.name == "codex":
            env |= {"CODEX_HOME": str(home / ".codex"), "RATELOOP_BENCH_KEY": "bench-local"}
        elif self.name == "gemini":
            env |= {
                "GEMINI_API_KEY": "bench-local-key",
                "GOOGLE_GEMINI_BASE_URL": url,
            }
        return env

    def prepare(self, home: Path) -> None:
        if self.name == "codex":
            (home / ".codex").mkdir(parents=True, exist_ok=True)
        if self.name == "claude":
            (home / ".claude").mkdir(parents=True, exist_ok=True)
        if self.name == "gemini":
            (home / ".gemini").mkdir(parents=True, exist_ok=True)
            settings = {
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "privacy": {"usageStatisticsEnabled": False},
                "telemetry": {"enabled": False},
                "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            }
            (home / ".gemini" / "settings.json").write_text(json.dumps(settings))


# ---------------------------------------------------------------------------------------------
# A case
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    agent: Agent
    refusal: str
    under_rateloop: bool
    max_retries: int = 2
    base_delay: float = 1.0
    max_delay: float = 2.0
    timeout: float = 420.0  # each attempt (rateloop --timeout) / the lone agent
    output: str = ""  # claude: "stream-json" instead of "json"
    # results
    requests: int = 0
    model_requests: int = 0
    paths: dict[str, int] = field(default_factory=dict)
    wall: float = 0.0
    exit_code: int | None = None
    summary: dict[str, Any] | None = None
    stdout: str = ""
    stderr: str = ""
    checks: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def name(self) -> str:
        where = f"rateloop run -r {self.max_retries}" if self.under_rateloop else "alone"
        output = f" {self.output}" if self.output else ""
        return f"{self.agent.name}{output} {self.refusal.split('-')[1]} {where}"


_MODEL_PATH = re.compile(r"/v1/messages|/responses|:generateContent|:streamGenerateContent")


def run_case(case: Case, bin_dir: Path) -> Case:
    home = Path(tempfile.mkdtemp(prefix=f"rl-bench-{case.agent.name}-"))
    try:
        case.agent.prepare(home)
        with RefusingServer(case.refusal) as server:
            command = case.agent.command(bin_dir, server.url, case.output)
            env = case.agent.env(home, server.url)
            if case.under_rateloop:
                env["PYTHONPATH"] = str(REPO / "src")
                command = [
                    sys.executable, "-m", "rateloop", "run", "--json",
                    "--max-retries", str(case.max_retries),
                    "--base-delay-secs", str(case.base_delay),
                    "--max-delay-secs", str(case.max_delay),
                    "--timeout", str(int(case.timeout)),
                    "--", *command,
                ]
                limit = (case.max_retries + 1) * (case.timeout + case.max_delay + 10) + 30
            else:
                limit = case.timeout
            started = time.monotonic()
            try:
                proc = subprocess.run(
                    command, env=env, cwd=home, stdin=subprocess.DEVNULL,
                    capture_output=True, timeout=limit, check=False,
                )
                case.exit_code = proc.returncode
                case.stdout = proc.stdout.decode("utf-8", "replace")
                case.stderr = proc.stderr.decode("utf-8", "replace")
            except subprocess.TimeoutExpired as exc:
                case.exit_code = None
                case.note = f"bench timeout after {limit:.0f} s"
                case.stdout = (exc.stdout or b"").decode("utf-8", "replace")
                case.stderr = (exc.stderr or b"").decode("utf-8", "replace")
            case.wall = time.monotonic() - started
            time.sleep(0.5)  # let the last request land
            hits = list(server.hits)
        case.requests = len(hits)
        for hit in hits:
            key = f"{hit.method} {hit.path.split('?')[0]}"
            case.paths[key] = case.paths.get(key, 0) + 1
        case.model_requests = sum(1 for h in hits if _MODEL_PATH.search(h.path))
        if case.under_rateloop:
            check(case)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return case


_REFUSAL_WORDS = {
    "anthropic-429": ("rate_limit_error", "rate limit", "429"),
    "anthropic-529": ("overloaded", "529"),
    "openai-429": ("rate limit", "rate_limit_exceeded", "429"),
    "gemini-429": ("resource has been exhausted", "resource_exhausted", "429"),
}


def check(case: Case) -> None:
    """What rateloop printed: its --json summary, the give-up message, the excerpt."""
    for line in reversed(case.stderr.splitlines()):
        if line.startswith("{") and '"status"' in line:
            with contextlib.suppress(ValueError):
                case.summary = json.loads(line)
            break
    s = case.summary or {}
    overload = case.refusal.endswith("529")
    want_kind = "overload" if overload else "temporary"
    case.checks.append(f"kind {s.get('kind')}" + (" ✓" if s.get("kind") == want_kind else " ✗"))
    errors = [ln for ln in case.stderr.splitlines() if ln.startswith("Error:")]
    message = errors[-1] if errors else ""
    if overload:
        ok = "overloaded" in message and "rate limit persisted" not in message
    else:
        ok = "rate limit persisted" in message
    case.checks.append("message names kind" + (" ✓" if ok else " ✗"))
    excerpt = excerpt_of(case.stderr)
    words = _REFUSAL_WORDS[case.refusal]
    shown = any(w in excerpt.lower() for w in words)
    case.checks.append("excerpt shows refusal" + (" ✓" if shown else " ✗"))


def excerpt_of(stderr: str) -> str:
    """The lines under rateloop's last ``--- ... ---`` excerpt header, up to its ``Error:``."""
    lines = stderr.splitlines()
    start = max((i for i, ln in enumerate(lines) if ln.startswith("--- ")), default=None)
    if start is None:
        return ""
    out = []
    for ln in lines[start + 1 :]:
        if ln.startswith("Error:"):
            break
        out.append(ln)
    return "\n".join(out)


def versions(bin_dir: Path, agents: list[Agent]) -> None:
    for agent in agents:
        try:
            proc = subprocess.run(
                [str(bin_dir / agent.name), "--version"], capture_output=True, timeout=60,
                check=False, env={**os.environ, **QUIET_ENV, "HOME": tempfile.gettempdir()},
                stdin=subprocess.DEVNULL,
            )
            agent.version = proc.stdout.decode().strip().splitlines()[-1]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            agent.version = "?"


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prefix", default="/tmp/agents", help="npm --prefix the CLIs are in")
    parser.add_argument("--only", default="claude,codex,gemini")
    parser.add_argument("--max-retries", type=int, default=2)
    parser.add_argument("--base-delay-secs", type=float, default=1.0)
    parser.add_argument("--max-delay-secs", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=420.0, help="per attempt / lone run")
    parser.add_argument("--skip-alone", action="store_true")
    parser.add_argument("--no-overload", action="store_true", help="skip Claude's 529 case")
    parser.add_argument("--save-outputs", type=Path, default=None)
    args = parser.parse_args(argv)

    bin_dir = Path(args.prefix) / "node_modules" / ".bin"
    wanted = [a.strip() for a in args.only.split(",") if a.strip()]
    refusal_of = {"claude": "anthropic-429", "codex": "openai-429", "gemini": "gemini-429"}
    agents = []
    for name in wanted:
        if not (bin_dir / name).exists():
            print(f"skip {name}: {bin_dir / name} not found (npm install it, see the docstring)")
            continue
        agents.append(Agent(name, refusal_of[name]))
    versions(bin_dir, agents)

    cases: list[Case] = []
    knobs = {
        "max_retries": args.max_retries,
        "base_delay": args.base_delay_secs,
        "max_delay": args.max_delay_secs,
        "timeout": args.timeout,
    }
    for agent in agents:
        if not args.skip_alone:
            cases.append(Case(agent, agent.refusal, False, **knobs))
        cases.append(Case(agent, agent.refusal, True, **knobs))
        if agent.name == "claude":
            # the same refusal, the retries visible (stream-json's api_retry events)
            cases.append(Case(agent, agent.refusal, True, output="stream-json", **knobs))
            # rateloop's default retry count, json and stream-json
            for output in ("", "stream-json"):
                cases.append(Case(agent, agent.refusal, True, output=output, **(knobs | {
                    "max_retries": 5})))
            if not args.no_overload:
                if not args.skip_alone:
                    cases.append(Case(agent, "anthropic-529", False, **knobs))
                cases.append(Case(agent, "anthropic-529", True, **knobs))

    print(
        f"rateloop run --max-retries {args.max_retries} --base-delay-secs {args.base_delay_secs}"
        f" --max-delay-secs {args.max_delay_secs} --timeout {args.timeout:.0f};"
        f" {len(cases)} cases at once",
        flush=True,
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(cases))) as pool:
        done = list(pool.map(lambda c: run_case(c, bin_dir), cases))

    if args.save_outputs is not None:
        args.save_outputs.mkdir(parents=True, exist_ok=True)
        for case in done:
            stem = case.name.replace(" ", "_")
            (args.save_outputs / f"{stem}.stdout").write_text(case.stdout)
            (args.save_outputs / f"{stem}.stderr").write_text(case.stderr)

    print()
    print("| case | version | requests (model) | wall | exit | runs | agent retries counted"
          " | kind | checks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in done:
        s = case.summary or {}
        attempts = s.get("attempts", "—") if case.under_rateloop else "—"
        agent_retries = s.get("agent_retries", "—") if case.under_rateloop else "—"
        kind = s.get("kind", "—") if case.under_rateloop else "—"
        checks = ", ".join(case.checks) or "—"
        exit_code = case.exit_code if case.exit_code is not None else case.note
        print(
            f"| {case.name} | {case.agent.version} | {case.requests} ({case.model_requests}) "
            f"| {case.wall:.1f} s | {exit_code} | {attempts} | {agent_retries} | {kind} "
            f"| {checks} |"
        )
    print()
    for case in done:
        print(f"## {case.name}: requests by path {case.paths}")
        if case.under_rateloop:
            errors = [ln for ln in case.stderr.splitlines() if ln.startswith("Error:")]
            print(f"   message: {errors[-1] if errors else '(none)'}")
            print("   excerpt: " + excerpt_of(case.stderr).replace("\n", "\n            ")[:1500])
        else:
            print("   stdout tail: " + case.stdout.strip()[-600:].replace("\n", " | "))
            print("   stderr tail: " + case.stderr.strip()[-600:].replace("\n", " | "))
    failed = any("✗" in c for case in done for c in case.checks)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
