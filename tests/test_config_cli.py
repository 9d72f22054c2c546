"""``rateloop config check`` and ``rateloop config schedule`` through the real CLI app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rateloop.cli import app
from rateloop.policy.cli import schedule_rows
from rateloop.timing.backoff import Backoff

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "policy.toml"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def lines_by_key(output: str) -> dict[str, str]:
    """``  key = value   # source`` lines → {key: "value   # source"}."""
    out: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("  ") and " = " in line:
            key, rest = line.strip().split(" = ", 1)
            out[key] = " ".join(rest.split())
    return out


def test_example_policy_is_accepted(runner: CliRunner) -> None:
    result = runner.invoke(app, ["config", "check", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    shown = lines_by_key(result.output)
    assert shown["max_attempts"] == f"20 # {EXAMPLE}"
    assert shown["fallback.routes"].startswith(
        "[anthropic:claude-sonnet-4-5:proj-main, openai:gpt-4.1]"
    )
    assert shown['limits."openai:gpt-4.1".requests_per_minute'] == f"500 # {EXAMPLE}"
    assert "no lock warnings" in result.output


def test_check_shows_the_layer_of_every_value_and_lock_warnings(
    runner: CliRunner, tmp_path: Path
) -> None:
    org = write(
        tmp_path,
        "org.toml",
        "max_attempts = 10\n[backoff]\nmax_delay_secs = 30\n"
        '[governance]\nlocked = ["max_attempts"]\n',
    )
    repo = write(tmp_path, "repo.yaml", "max_attempts: 50\nbackoff:\n  jitter: full\n")
    result = runner.invoke(app, ["config", "check", str(org), str(repo)])
    assert result.exit_code == 0, result.output
    assert f"effective policy (defaults < {org} < {repo}):" in result.output
    shown = lines_by_key(result.output)
    assert shown["max_attempts"] == f"10 # {org}"
    assert shown["backoff.max_delay_secs"] == f"30 # {org}"
    assert shown["backoff.jitter"] == f'"full" # {repo}'
    assert shown["backoff.multiplier"] == "2 # defaults"
    assert shown["max_wait_secs"] == "(unset) # defaults"
    assert "1 lock warning (changes not applied):" in result.output
    assert f"{repo} tried to set max_attempts = 50; kept 10 (locked by {org})" in result.output
    strict = runner.invoke(app, ["config", "check", "--strict", str(org), str(repo)])
    assert strict.exit_code == 1


def test_check_reports_every_error_and_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.toml", "max_attempts = 0\n[backoff]\njiter = 'full'\n")
    broken = write(tmp_path, "broken.yaml", "a: [1\n")
    result = runner.invoke(app, ["config", "check", str(bad), str(broken)])
    assert result.exit_code == 2
    text = result.output
    assert text.startswith("rateloop: invalid policy: 3 errors\n")
    assert f"{bad}: max_attempts: invalid value 0 (allowed: an integer from 1 to 1000)" in text
    assert "did you mean 'jitter'?" in text
    assert f"{broken}: invalid YAML at line 2" in text


def test_check_reads_pyproject_tool_table(runner: CliRunner, tmp_path: Path) -> None:
    pyproject = write(
        tmp_path, "pyproject.toml", '[project]\nname = "x"\n[tool.rateloop]\nmax_attempts = 3\n'
    )
    result = runner.invoke(app, ["config", "check", str(pyproject)])
    assert result.exit_code == 0, result.output
    assert lines_by_key(result.output)["max_attempts"] == f"3 # {pyproject} [tool.rateloop]"


def test_check_needs_a_file(runner: CliRunner) -> None:
    assert runner.invoke(app, ["config", "check"]).exit_code != 0


def test_schedule_of_the_defaults(runner: CliRunner) -> None:
    result = runner.invoke(app, ["config", "schedule"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line[:1].isdigit()]
    assert rows == [
        ["1", "5·2^0", "=", "5", "[2.5,", "5]"],
        ["2", "5·2^1", "=", "10", "[5,", "10]"],
        ["3", "5·2^2", "=", "20", "[10,", "20]"],
        ["4", "5·2^3", "=", "40", "[20,", "40]"],
        ["5..19", "capped", "at", "60", "[30,", "60]"],
    ]
    assert "exponential 5·2^(n−1) s, capped at 60 s, equal jitter" in result.output
    assert "975 s, beyond the recovery budget of 600 s" in result.output


def test_schedule_of_a_file(runner: CliRunner, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.toml",
        "max_attempts = 8\n[backoff]\nstrategy = 'linear'\ninitial_delay_secs = 10\n"
        "max_delay_secs = 30\njitter = 'none'\n",
    )
    result = runner.invoke(app, ["config", "schedule", str(path)])
    assert result.exit_code == 0, result.output
    rows = [" ".join(line.split()) for line in result.output.splitlines() if line[:1].isdigit()]
    assert rows == ["1 10·1 = 10 [10, 10]", "2 10·2 = 20 [20, 20]", "3..7 capped at 30 [30, 30]"]
    assert "180 s, within the recovery budget of 600 s" in result.output


def test_schedule_with_one_attempt_and_with_errors(runner: CliRunner, tmp_path: Path) -> None:
    one = write(tmp_path, "one.toml", "max_attempts = 1\n")
    result = runner.invoke(app, ["config", "schedule", str(one)])
    assert result.exit_code == 0
    assert "no retries: max_attempts is 1" in result.output
    bad = write(tmp_path, "bad.toml", "max_attempts = 1001\n")
    assert runner.invoke(app, ["config", "schedule", str(bad)]).exit_code == 2


def test_schedule_rows_collapse_identical_runs() -> None:
    constant = Backoff(strategy="constant", initial=3, jitter="full")
    assert schedule_rows(constant, 5) == [("1..5", "3", 0.0, 3.0)]
    decorrelated = Backoff(strategy="decorrelated", initial=5, max_delay=60, jitter="none")
    assert schedule_rows(decorrelated, 6) == [
        ("1", "U(5, 3·previous)", 5.0, 15.0),
        ("2", "U(5, 3·previous)", 5.0, 45.0),
        ("3..6", "U(5, 3·previous)", 5.0, 60.0),
    ]


def test_console_script_runs_config_check() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rateloop", "config", "check", str(EXAMPLE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "effective policy" in out.stdout


def test_config_check_never_prints_a_connection_password(tmp_path: Path) -> None:
    from rateloop.policy import Policy

    path = tmp_path / "p.toml"
    path.write_text('[admission]\nbackend = "redis://app:s3cret@127.0.0.1:6379/0"\n')
    out = CliRunner().invoke(app, ["config", "check", str(path)])
    assert out.exit_code == 0, out.output
    assert "s3cret" not in out.output
    assert 'admission.backend = "redis://app:***@127.0.0.1:6379/0"' in out.output
    policy = Policy.from_toml(path)
    assert "s3cret" not in repr(policy) and "s3cret" not in repr(policy.admission)
    assert policy.admission.backend.endswith("s3cret@127.0.0.1:6379/0")  # the value itself is kept


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0?password=s3cretpw",
        "redis://:s3cretpw@127.0.0.1:6379/0",
        "rediss://user:s3cretpw@127.0.0.1:6379/0?ssl_cert_reqs=none",
    ],
)
def test_check_hides_every_form_of_backend_password(
    runner: CliRunner, tmp_path: Path, url: str
) -> None:
    org = tmp_path / "org.toml"
    org.write_text(f'[admission]\nbackend = "{url}"\n[governance]\nlocked = ["admission"]\n')
    repo = tmp_path / "repo.toml"
    repo.write_text(f'[admission]\nbackend = "{url.replace("s3cretpw", "0therpw")}"\n')
    result = runner.invoke(app, ["config", "check", str(org), str(repo)])
    assert result.exit_code == 0, result.output
    assert "1 lock warning" in result.output
    assert "s3cretpw" not in result.output and "0therpw" not in result.output
    assert "***" in result.output


def test_check_rejects_a_bad_port_without_crashing(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[admission]\nbackend = "redis://:s3cretpw@127.0.0.1:99999/0"\n')
    result = runner.invoke(app, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert "admission.backend" in result.output and "a port from 1 to 65535" in result.output
    assert "s3cretpw" not in result.output


def test_schedule_says_when_the_pause_limit_caps_the_waits(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = tmp_path / "p.toml"
    path.write_text("pause_limit_secs = 10\n")
    result = runner.invoke(app, ["config", "schedule", str(path)])
    assert result.exit_code == 0, result.output
    assert "waits above the pause limit (10 s) are capped at it." in result.output
    default = runner.invoke(app, ["config", "schedule"])
    assert "capped at it" not in default.output
