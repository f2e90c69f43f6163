"""Deployment files, validated without a Docker engine, systemd as PID 1 or a cluster.

Every file is parsed here and its structure checked; that is the guaranteed check. When
the real tool is on PATH it validates the file as well (`docker-compose config -q`,
`systemd-analyze verify`, `systemd-sysusers --dry-run`); those tests are skipped,
visibly, where the tool is missing, never the parsing ones. The Kubernetes manifests:
test_deploy_kubernetes.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from bashfleet.client.redis_server import find_redis_server, supports_acl
from bashfleet.worker.settings import SECRET_VARIABLES, Settings
from bashfleet.worker.wire import acl

from .deploy_helpers import (
    K8S,
    PLACEHOLDER,
    PROBE,
    ROOT,
    RUN_USER,
    SYSTEMD,
    WORKER_CAPS,
    _acl_script,
    _command,
    _compose_fixture,  # noqa: F401 - the `compose` fixture
    _documents,
)

# ------------------------------------------------------------------- docker-compose


#: The Compose variables of the two Redis users' passwords (.env).
WORKER_PASSWORD = "BASHFLEET_REDIS_WORKER_PASSWORD"
CLIENT_PASSWORD = "BASHFLEET_REDIS_CLIENT_PASSWORD"


def test_redis_loads_the_two_users_with_persistence_and_noeviction(
    compose: dict[str, Any],
) -> None:
    redis_ = compose["services"]["redis"]
    command = _command(redis_)
    assert "--requirepass" not in command  # the default user is off: ACL users only
    aclfile = command[command.index("--aclfile") + 1]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    # The file comes from the one-shot redis-acl service, through its volume, read-only.
    assert f"redis-acl:{os.path.dirname(aclfile)}:ro" in redis_["volumes"]
    assert redis_["depends_on"]["redis-acl"] == {"condition": "service_completed_successfully"}
    # The healthcheck authenticates as the workers' user, its password not in argv.
    assert redis_["healthcheck"]["test"][0] == "CMD-SHELL"
    assert redis_["healthcheck"]["test"][1].startswith(f"redis-cli --user {acl.WORKER_USER} ping")
    assert redis_["environment"]["REDISCLI_AUTH"].startswith("${" + WORKER_PASSWORD)


def test_a_one_shot_service_writes_the_acl_file_for_the_redis_user(
    compose: dict[str, Any],
) -> None:
    service = compose["services"]["redis-acl"]
    script = _acl_script(_command(service))
    assert "bashfleet redis-acl --worker-password-file" in script.replace("\\\n", "")
    assert "umask 077" in script.splitlines()[0]  # the password files: 0600
    # Passwords from the environment (`$$` is a literal `$` to Compose): never
    # interpolated into the command, which would put them on sh's command line.
    assert "${" not in script
    assert set(service["environment"]) == {WORKER_PASSWORD, CLIENT_PASSWORD}
    assert "/acl/users.acl" in script and "chown 999 " in script  # the redis image's user
    assert service["volumes"] == ["redis-acl:/acl"]
    assert service["network_mode"] == "none" and service["cap_drop"] == ["ALL"]
    assert "redis-acl" in compose["volumes"]


def test_two_workers_with_distinct_host_ids(compose: dict[str, Any]) -> None:
    workers = {
        name: svc for name, svc in compose["services"].items() if "worker" in _command(svc)
    }
    assert len(workers) == 2
    hosts = {svc["environment"]["BASHFLEET_HOST"] for svc in workers.values()}
    assert len(hosts) == 2
    for svc in workers.values():
        command = _command(svc)
        assert command[command.index("--host") + 1] == svc["environment"]["BASHFLEET_HOST"]
        assert svc["environment"]["BASHFLEET_REDIS_URL"].startswith(
            f"redis://{acl.WORKER_USER}:${{{WORKER_PASSWORD}}}@")


def test_compose_workers_get_what_bubblewrap_needs_and_no_more(compose: dict[str, Any]) -> None:
    workers = [svc for svc in compose["services"].values() if "worker" in _command(svc)]
    for svc in workers:
        assert svc["cap_drop"] == ["ALL"]
        assert set(svc["cap_add"]) == WORKER_CAPS
        assert "apparmor=unconfined" in svc["security_opt"]
        assert "privileged" not in svc
        assert "user" not in svc  # the image's: root, which runs calls as bashfleet-run


def test_flower_requires_auth_and_is_published_on_loopback(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    assert flower["user"] == "bashfleet"  # runs no command, needs no root
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("admin:${FLOWER_PASSWORD")
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])
    # Flower reads the queues: the workers' user.
    assert flower["environment"]["BASHFLEET_REDIS_URL"].startswith(
        f"redis://{acl.WORKER_USER}:${{{WORKER_PASSWORD}}}@")


def test_images_come_from_the_project_dockerfile(compose: dict[str, Any]) -> None:
    built = [svc for svc in compose["services"].values() if "build" in svc]
    # Built by the first service to run: the one writing Redis's ACL file.
    assert built == [compose["services"]["redis-acl"]]
    assert built[0]["build"]["dockerfile"] == "deploy/Dockerfile"
    image = built[0]["image"]
    for name, svc in compose["services"].items():
        if name != "redis":
            assert svc["image"] == image


def test_dockerfile_worker_is_root_and_runs_calls_as_its_own_unprivileged_account() -> None:
    text = re.sub(r"\\\n\s*", " ", (ROOT / "deploy" / "Dockerfile").read_text())
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users[-1] == "root"  # the worker (its secrets: root's alone)
    run_user = re.search(r"useradd ([^&]*) bashfleet-run", text)
    assert run_user is not None
    assert "--no-create-home" in run_user[1] and "nologin" in run_user[1]
    assert "--user-group" in run_user[1]  # a group of its own, shared with nobody
    env = re.search(r"^ENV (.*)$", text, re.MULTILINE)
    assert env is not None and f"BASHFLEET_RUN_AS={RUN_USER}" in env[1].split()
    assert "bubblewrap" in text and "tini" in text
    assert "install -d -m 0700 /var/lib/bashfleet" in text
    assert "HEALTHCHECK" in text
    # This host's own heartbeat, not "Redis answers" (`hosts --json` passes for any host).
    health = re.search(r"^HEALTHCHECK .* CMD (\[.*\])$", text, re.MULTILINE)
    assert health is not None and json.loads(health[1]) == ["bashfleet", "hosts", "--alive"]
    assert "pip install" in text


def _compose_binary() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False, timeout=30
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    binary = _compose_binary()
    if binary is None:
        pytest.skip("docker-compose is not on PATH; the parsing tests above cover the file")
    secrets_ = (WORKER_PASSWORD, CLIENT_PASSWORD, "BASHFLEET_SIGNING_KEY", "FLOWER_PASSWORD")
    base = {k: v for k, v in os.environ.items() if k not in secrets_}
    given = {WORKER_PASSWORD: "test-worker", CLIENT_PASSWORD: "test-client",
             "BASHFLEET_SIGNING_KEY": "test-only", "FLOWER_PASSWORD": "test-only"}
    # Needs no engine: it only parses, interpolates and validates.
    done = subprocess.run(
        [*binary, "-f", "docker-compose.yml", "config", "-q"], cwd=ROOT, capture_output=True,
        text=True, check=False, timeout=60, env={**base, **given},
    )
    assert done.returncode == 0, done.stderr
    # Without a password it refuses (the ${VAR:?} guards): no fleet without auth.
    for name in (WORKER_PASSWORD, CLIENT_PASSWORD):
        refused = subprocess.run(
            [*binary, "-f", "docker-compose.yml", "config", "-q"], cwd=ROOT,
            capture_output=True, text=True, check=False, timeout=60,
            env={**base, **{k: v for k, v in given.items() if k != name}},
        )
        assert refused.returncode != 0
        assert name in refused.stderr + refused.stdout


def _run_acl_script(script: str, into: Path, worker: str, client: str) -> Path:
    """Run a deploy file's ACL-writing script here, its /acl/ being `into`; the file."""
    into.mkdir()
    # `bashfleet` is this checkout's CLI; chown (to the redis image's user) a no-op.
    prelude = (f"bashfleet() {{ {shlex.quote(sys.executable)} -c "
               "'import sys; from bashfleet.client.cli import main; sys.exit(main())' \"$@\"; }\n"
               "chown() { :; }\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(sys.path),
           "HOME": str(into), "BASHFLEET_STATE_DIR": str(into / "state"),
           "BASHFLEET_REDIS_WORKER_PASSWORD": worker, "BASHFLEET_REDIS_CLIENT_PASSWORD": client}
    done = subprocess.run(["sh", "-ec", prelude + script.replace("/acl/", f"{into}/")],
                          env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in into.iterdir() if p.name != "state") == ["users.acl"]
    return into / "users.acl"


def test_the_acl_files_the_deploy_files_write_make_redis_tell_workers_from_clients(
    compose: dict[str, Any], tmp_path: Path,
) -> None:
    """Both deploy files' scripts write `bashfleet redis-acl`'s file; a real Redis 7
    loads it with --aclfile: the workers' user writes a host record, the clients' user
    reads it and cannot write it, the default user is off."""
    binary = find_redis_server()
    if not supports_acl(binary):
        pytest.skip("needs Redis 7 (ACL selectors): apt-get install redis-server")
    worker, client = "w-" + "1" * 30, "c-" + "2" * 30
    redis_yaml = {d["kind"]: d for d in _documents(K8S / "redis.yaml")}
    init = redis_yaml["StatefulSet"]["spec"]["template"]["spec"]["initContainers"][0]
    files = [
        _run_acl_script(_acl_script(_command(compose["services"]["redis-acl"])).replace(
            "$$", "$"), tmp_path / "compose", worker, client),
        _run_acl_script(_acl_script(init["command"]), tmp_path / "k8s", worker, client),
    ]
    for path in files:
        assert path.read_text() == acl.acl_file(worker, client)
        assert path.stat().st_mode & 0o777 == 0o400
    sock = tmp_path / "redis.sock"
    server = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
         "--aclfile", str(files[0]), "--dir", str(tmp_path), "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert server.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.02)
        as_worker = redis.Redis(unix_socket_path=str(sock), username=acl.WORKER_USER,
                                password=worker, decode_responses=True)
        as_client = redis.Redis(unix_socket_path=str(sock), username=acl.CLIENT_USER,
                                password=client, decode_responses=True)
        with as_worker, as_client, redis.Redis(unix_socket_path=str(sock)) as anonymous:
            with pytest.raises(redis.AuthenticationError):
                anonymous.ping()
            as_worker.hset("bashfleet:host:h1", "concurrency", "4")
            assert as_client.hgetall("bashfleet:host:h1") == {"concurrency": "4"}
            with pytest.raises(redis.exceptions.NoPermissionError):
                as_client.hset("bashfleet:host:h1", "concurrency", "99")
            with pytest.raises(redis.exceptions.NoPermissionError):
                as_client.delete("bashfleet:host:h1")
            assert as_client.set("bashfleet:call:c1", "x")  # its own calls' records
        # The probes: healthy with the workers' password only.
        if shutil.which("redis-cli") is not None:
            probe = PROBE.replace("redis-cli ", f"redis-cli -s {shlex.quote(str(sock))} ")
            for password, healthy in ((worker, True), (client, False), ("wrong", False)):
                done = subprocess.run(
                    ["sh", "-c", probe], capture_output=True, check=False, timeout=10,
                    env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": password},
                )
                assert (done.returncode == 0) is healthy, (password, done)
    finally:
        server.terminate()
        server.wait(timeout=10)


# -------------------------------------------------------------------------- systemd

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(path: Path) -> Unit:
    """A unit file as {section: [(key, value), ...]} (keys may repeat, as in systemd)."""
    sections: Unit = {}
    current: list[tuple[str, str]] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}:{number}: a setting outside any section"
        key, sep, value = line.partition("=")
        assert sep and key.strip() and not key.strip().count(" "), f"{path.name}:{number}"
        current.append((key.strip(), value.strip()))
    return sections


def one(unit: Unit, section: str, key: str) -> str:
    values = [v for k, v in unit.get(section, []) if k == key]
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


def keys(unit: Unit, section: str) -> set[str]:
    return {k for k, _ in unit.get(section, [])}


@pytest.fixture(scope="module")
def worker_unit() -> Unit:
    return parse_unit(SYSTEMD / "bashfleet-worker.service")


@pytest.fixture(scope="module")
def gc_unit() -> Unit:
    return parse_unit(SYSTEMD / "bashfleet-gc.service")


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)\s*(s|min)?", value)
    assert match, value
    return float(match[1]) * (60 if match[2] == "min" else 1)


def _environment(unit: Unit) -> dict[str, str]:
    """Every VAR=value of the unit's Environment= lines."""
    found: dict[str, str] = {}
    for key, value in unit["Service"]:
        if key == "Environment":
            found.update(item.split("=", 1) for item in value.split())  # type: ignore[misc]
    return found


def test_worker_unit_runs_the_worker_as_root_and_calls_as_another_account(
    worker_unit: Unit,
) -> None:
    service = "Service"
    assert one(worker_unit, service, "ExecStart").endswith("/bashfleet worker")
    assert "User" not in keys(worker_unit, service)  # root: its secrets are root's alone
    assert "Group" not in keys(worker_unit, service)
    assert _environment(worker_unit)["BASHFLEET_RUN_AS"] == RUN_USER
    assert one(worker_unit, service, "EnvironmentFile") == "/etc/bashfleet/worker.env"
    assert one(worker_unit, service, "StateDirectory") == "bashfleet"
    assert one(worker_unit, service, "StateDirectoryMode") == "0700"
    assert one(worker_unit, "Install", "WantedBy") == "multi-user.target"


def test_worker_unit_loads_its_secrets_as_credentials_not_environment(
    worker_unit: Unit,
) -> None:
    credentials = dict(
        value.split(":", 1) for key, value in worker_unit["Service"] if key == "LoadCredential"
    )
    assert credentials == {"signing-key": "/etc/bashfleet/signing.key",
                           "redis-url": "/etc/bashfleet/redis.url"}
    environment = _environment(worker_unit)
    assert environment["BASHFLEET_SIGNING_KEY_FILE"] == "%d/signing-key"
    assert environment["BASHFLEET_REDIS_URL_FILE"] == "%d/redis-url"
    assert not {"BASHFLEET_SIGNING_KEY", "BASHFLEET_REDIS_URL"} & set(environment)


def test_worker_unit_bounds_the_root_workers_capabilities(worker_unit: Unit) -> None:
    bounding = one(worker_unit, "Service", "CapabilityBoundingSet").split()
    assert {cap.removeprefix("CAP_") for cap in bounding} == WORKER_CAPS


def test_worker_unit_restarts_on_failure_with_a_backoff(worker_unit: Unit) -> None:
    assert one(worker_unit, "Service", "Restart") == "on-failure"
    assert _seconds(one(worker_unit, "Service", "RestartSec")) >= 1
    assert int(one(worker_unit, "Unit", "StartLimitBurst")) >= 1
    assert _seconds(one(worker_unit, "Unit", "StartLimitIntervalSec")) > 0
    # A usage error (exit status 2) is not retried.
    assert one(worker_unit, "Service", "RestartPreventExitStatus") == "2"


def test_worker_unit_stop_ends_the_worker_but_not_the_background_jobs(
    worker_unit: Unit,
) -> None:
    # `mixed` and `control-group` SIGKILL the whole cgroup once the main process is gone,
    # background jobs included (they are in the unit's cgroup, in their own sessions).
    assert one(worker_unit, "Service", "KillMode") == "process"
    assert one(worker_unit, "Service", "KillSignal") == "SIGTERM"
    # Longer than the supervisor's own shutdown (bashfleet.worker.fleet.supervisor.STOP_TIMEOUT_S
    # and the ctl consumer's 5 s).
    from bashfleet.worker.fleet.supervisor import STOP_TIMEOUT_S  # noqa: PLC0415

    assert _seconds(one(worker_unit, "Service", "TimeoutStopSec")) >= STOP_TIMEOUT_S + 10
    # An OOM-killed build must not stop the worker.
    assert one(worker_unit, "Service", "OOMPolicy") == "continue"


def test_worker_unit_hardening_leaves_builds_working(worker_unit: Unit) -> None:
    assert one(worker_unit, "Service", "NoNewPrivileges") == "yes"
    # Bounded, and the per-call cgroups of the delegated subtree are writable.
    assert one(worker_unit, "Service", "TasksMax") != "infinity"
    assert one(worker_unit, "Service", "Delegate") == "yes"
    assert one(worker_unit, "Service", "ProtectSystem") == "full"  # not strict: builds write
    present = keys(worker_unit, "Service")
    for breaks_builds in ("PrivateTmp", "ProtectHome", "PrivateDevices",
                          "MemoryDenyWriteExecute", "ReadOnlyPaths", "PrivateNetwork"):
        assert breaks_builds not in present, breaks_builds


def test_gc_service_and_timer(gc_unit: Unit) -> None:
    assert one(gc_unit, "Service", "Type") == "oneshot"
    assert one(gc_unit, "Service", "ExecStart").endswith("/bashfleet gc")
    assert "User" not in keys(gc_unit, "Service")  # the worker's (root), as its files are
    assert set(one(gc_unit, "Service", "CapabilityBoundingSet").split()) == {
        "CAP_DAC_OVERRIDE", "CAP_FOWNER"
    }
    assert one(gc_unit, "Service", "EnvironmentFile") == "/etc/bashfleet/worker.env"
    # Strict, with the state directory writable: the default state dir of both units.
    assert one(gc_unit, "Service", "ProtectSystem") == "strict"
    worker = parse_unit(SYSTEMD / "bashfleet-worker.service")
    state = f"/var/lib/{one(worker, 'Service', 'StateDirectory')}"
    assert one(gc_unit, "Service", "ReadWritePaths") == state
    timer = parse_unit(SYSTEMD / "bashfleet-gc.timer")
    assert one(timer, "Timer", "OnCalendar") == "hourly"
    assert one(timer, "Timer", "Persistent") == "true"
    assert one(timer, "Install", "WantedBy") == "timers.target"
    # No Unit= in the timer: it starts the service of the same name.
    assert "Unit" not in keys(timer, "Timer")
    assert (SYSTEMD / "bashfleet-gc.service").exists()


def _env_example() -> dict[str, str]:
    """Active and commented-out VAR=value lines of worker.env.example."""
    found: dict[str, str] = {}
    for raw in (SYSTEMD / "worker.env.example").read_text().splitlines():
        line = raw.lstrip("#").strip()
        match = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S*)", line)
        if match:
            found[match[1]] = match[2]
        elif raw.strip() and not raw.startswith("#"):
            pytest.fail(f"not a VAR=value line: {raw!r}")
    return found


def test_worker_env_example_names_only_real_settings_and_no_secret() -> None:
    variables = _env_example()
    assert variables, "the example sets something"
    fields = {f"BASHFLEET_{name.upper()}" for name in Settings.model_fields}
    assert set(variables) <= fields, set(variables) - fields
    # The secrets are credentials of their own (LoadCredential=), never in this file.
    assert not set(variables) & set(SECRET_VARIABLES), set(variables) & set(SECRET_VARIABLES)
    assert PLACEHOLDER not in "".join(variables.values())
    text = (SYSTEMD / "worker.env.example").read_text()
    assert "install -m 0600 worker.env.example" in text
    assert "0640" not in text and "bashfleet -m" not in text  # no group may read it
    for name in ("BASHFLEET_RETENTION_MAX_AGE_S", "BASHFLEET_RETENTION_MAX_BYTES",
                 "BASHFLEET_RETENTION_MIN_AGE_S"):
        assert name in variables
    # The commented defaults are the real defaults.
    settings = Settings(redis_url=None)
    for name, value in variables.items():
        field = name.removeprefix("BASHFLEET_").lower()
        if field.startswith("retention_"):
            assert float(value) == getattr(settings, field), name


def test_sysusers_creates_the_run_user_only() -> None:
    lines = [raw for raw in (SYSTEMD / "bashfleet.sysusers.conf").read_text().splitlines()
             if raw and not raw.startswith("#")]
    assert len(lines) == 1
    kind, name, uid, _, home, shell = re.findall(r'"[^"]*"|\S+', lines[0])
    assert (kind, name, uid) == ("u", RUN_USER, "-")  # a system uid, and a group of its own
    assert home == "/nonexistent" and shell.endswith("nologin")


def _copy_units(tmp_path: Path) -> list[Path]:
    # `verify` checks that ExecStart= is an executable: point it at a stand-in.
    stub = tmp_path / "bashfleet"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    copies = []
    for unit in sorted(SYSTEMD.glob("bashfleet-*")):
        copy = tmp_path / unit.name
        copy.write_text(unit.read_text().replace("/opt/bashfleet/venv/bin/bashfleet", str(stub)))
        copies.append(copy)
    return copies


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not on PATH; the parsing tests above cover the units")
    copies = _copy_units(tmp_path)
    assert {c.name for c in copies} == {
        "bashfleet-worker.service", "bashfleet-gc.service", "bashfleet-gc.timer"
    }
    done = subprocess.run(
        ["systemd-analyze", "verify", *map(str, copies)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    # Unknown keys and bad values are only warnings (status 0): any line naming one of
    # our units is a failure.
    ours = [line for line in done.stderr.splitlines() if "bashfleet" in line]
    assert done.returncode == 0 and not ours, done.stderr


def test_systemd_analyze_catches_a_bad_setting(tmp_path: Path) -> None:
    # The check above can fail: a typo in a value shows on stderr.
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not on PATH")
    worker = next(c for c in _copy_units(tmp_path) if c.name == "bashfleet-worker.service")
    worker.write_text(worker.read_text().replace("KillMode=process", "KillMode=procss"))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(worker)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert "kill mode" in done.stderr.lower()


def test_systemd_sysusers_accepts_the_user(tmp_path: Path) -> None:
    if shutil.which("systemd-sysusers") is None:
        pytest.skip("systemd-sysusers is not on PATH; the parsing test covers the file")
    (tmp_path / "etc").mkdir()
    # --root and --dry-run: nothing is created on this machine.
    done = subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", "--dry-run",
         str(SYSTEMD / "bashfleet.sysusers.conf")],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Creating user 'bashfleet-run'" in done.stdout + done.stderr
