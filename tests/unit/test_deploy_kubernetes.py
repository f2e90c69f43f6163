"""Kubernetes manifests (deploy/k8s), validated without a cluster: each parsed and its
structure checked; `kubectl kustomize` renders them too where kubectl is on PATH
(skipped, visibly, where it is missing). The other deployment files:
test_deploy.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import acl

from .deploy_helpers import (
    K8S,
    PLACEHOLDER,
    PROBE,
    ROOT,
    RUN_USER,
    WORKER_CAPS,
    _acl_script,
    _command,
    _compose_fixture,  # noqa: F401 - the `compose` fixture
    _documents,
)

# ------------------------------------------------------------------------ kubernetes


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return data


@pytest.fixture(scope="module")
def manifests(kustomization: dict[str, Any]) -> list[dict[str, Any]]:
    """Every resource the kustomization applies."""
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += _documents(K8S / name)
    return docs


def _find(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in manifests if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    containers: list[dict[str, Any]] = spec.get("initContainers", []) + spec["containers"]
    return containers


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _secret_ref(entry: dict[str, Any]) -> tuple[str, str]:
    ref = entry["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_every_yaml_file_parses_and_the_kustomization_lists_all_but_the_example(
    kustomization: dict[str, Any],
) -> None:
    files = {p.name for p in K8S.glob("*.yaml")}
    for name in files:
        assert _documents(K8S / name), name
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == "bashfleet"
    assert set(kustomization["resources"]) == files - {"kustomization.yaml",
                                                       "secret.example.yaml"}


def test_the_kinds(manifests: list[dict[str, Any]]) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in manifests)
    assert kinds == [
        ("DaemonSet", "bashfleet-worker"),
        ("Deployment", "flower"),
        ("Namespace", "bashfleet"),
        ("Service", "flower"),
        ("Service", "redis"),
        ("Service", "redis-headless"),
        ("StatefulSet", "redis"),
    ]
    for doc in manifests:
        assert {"apiVersion", "kind", "metadata"} <= set(doc)


def test_redis_statefulset(manifests: list[dict[str, Any]]) -> None:
    redis = _find(manifests, "StatefulSet", "redis")
    assert redis["spec"]["replicas"] == 1
    assert redis["spec"]["serviceName"] == "redis-headless"
    assert _find(manifests, "Service", "redis-headless")["spec"]["clusterIP"] == "None"
    init, container = _containers(redis)
    args = container["args"]
    assert "--requirepass" not in args  # the default user is off: ACL users only
    aclfile = args[args.index("--aclfile") + 1]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    env = _env(container)
    # The probes authenticate as the workers' user, the password from the environment.
    assert set(env) == {"REDISCLI_AUTH"}
    assert _secret_ref(env["REDISCLI_AUTH"]) == ("bashfleet-redis", "worker-password")
    for probe in ("readinessProbe", "livenessProbe"):
        # redis-cli exits 0 on an error reply: the probe greps its answer.
        assert container[probe]["exec"]["command"] == ["sh", "-c", PROBE]
    # The init container writes the ACL file into a volume of this pod alone.
    script = _acl_script(init["command"])
    assert "bashfleet redis-acl --worker-password-file" in script.replace("\\\n", "")
    assert "umask 077" in script.splitlines()[0] and aclfile in script
    assert {k: _secret_ref(v) for k, v in _env(init).items()} == {
        "BASHFLEET_REDIS_WORKER_PASSWORD": ("bashfleet-redis", "worker-password"),
        "BASHFLEET_REDIS_CLIENT_PASSWORD": ("bashfleet-redis", "client-password"),
    }
    volumes = {v["name"]: v for v in redis["spec"]["template"]["spec"]["volumes"]}
    acl_dir = os.path.dirname(aclfile)
    (written,) = [m["name"] for m in init["volumeMounts"] if m["mountPath"] == acl_dir]
    (read,) = [m for m in container["volumeMounts"] if m["mountPath"] == acl_dir]
    assert read["name"] == written and read["readOnly"] is True
    assert "emptyDir" in volumes[written]
    pod = redis["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsUser"] == 999 and pod["runAsNonRoot"] is True  # the init's too
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == args[args.index("--dir") + 1]
    assert claim["spec"]["resources"]["requests"]["storage"]
    # The selector of each Service reaches the pods.
    labels = redis["spec"]["template"]["metadata"]["labels"]
    for name in ("redis", "redis-headless"):
        selector = _find(manifests, "Service", name)["spec"]["selector"]
        assert selector.items() <= labels.items()


def test_worker_daemonset_takes_its_host_id_from_the_node(
    manifests: list[dict[str, Any]],
) -> None:
    worker = _find(manifests, "DaemonSet", "bashfleet-worker")
    container = next(c for c in worker["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "worker")
    assert container["args"] == ["bashfleet", "worker"]
    env = _env(container)
    assert env["BASHFLEET_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The state directory is the mounted volume, and that is a hostPath.
    state_dir = env["BASHFLEET_STATE_DIR"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[state_dir]]["hostPath"]["path"]
    # Never two workers on one node's state directory during a rollout.
    assert worker["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    from bashfleet.worker.fleet.supervisor import STOP_TIMEOUT_S  # noqa: PLC0415

    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= STOP_TIMEOUT_S + 10


def test_every_worker_of_a_node_claims_ids_in_the_nodes_lock_directory(
    manifests: list[dict[str, Any]], compose: dict[str, Any],
) -> None:
    """A container's own /run would make its id claims its own: two workers of one
    machine could hand two tenants the same host ids."""
    lock_dir = str(Settings.model_fields["id_lock_dir"].default)
    worker = _find(manifests, "DaemonSet", "bashfleet-worker")
    container = next(c for c in worker["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "worker")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[lock_dir]]["hostPath"]["path"] == lock_dir
    workers = [svc for svc in compose["services"].values() if "worker" in _command(svc)]
    assert len(workers) == 2
    for svc in workers:
        assert f"{lock_dir}:{lock_dir}" in svc["volumes"]


def _worker_container(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    worker = _find(manifests, "DaemonSet", "bashfleet-worker")
    container = next(c for c in worker["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "worker")
    return worker, container


def test_worker_daemonset_gives_bubblewrap_what_it_needs_and_no_more(
    manifests: list[dict[str, Any]],
) -> None:
    worker, container = _worker_container(manifests)
    pod = worker["spec"]["template"]["spec"]["securityContext"]
    # RuntimeDefault kept: with CAP_SYS_ADMIN in the bounding set it allows the
    # namespace and mount calls (containerd's contrib/seccomp); never Unconfined.
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == WORKER_CAPS
    assert security["appArmorProfile"] == {"type": "Unconfined"}  # the default denies mount
    assert "privileged" not in security and "procMount" not in security
    # Kubernetes refuses allowPrivilegeEscalation: false with CAP_SYS_ADMIN.
    assert security["allowPrivilegeEscalation"] is True
    # Root runs the worker; calls run as the image's bashfleet-run.
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False
    assert _env(container)["BASHFLEET_RUN_AS"]["value"] == RUN_USER


def test_worker_daemonset_reads_its_secrets_from_root_only_files(
    manifests: list[dict[str, Any]],
) -> None:
    worker, container = _worker_container(manifests)
    env = _env(container)
    assert not any("valueFrom" in entry and "secretKeyRef" in entry["valueFrom"]
                   for entry in env.values()), "no secret in the worker's environment"
    volumes = {v["name"]: v for v in worker["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    projected = volumes["secrets"]["projected"]
    assert projected["defaultMode"] == 0o400 and mounts["secrets"]["readOnly"] is True
    files = {
        f"{mounts['secrets']['mountPath']}/{item['path']}": (source["secret"]["name"], item["key"])
        for source in projected["sources"] for item in source["secret"]["items"]
    }
    assert files == {
        env["BASHFLEET_REDIS_URL_FILE"]["value"]: ("bashfleet-redis-url", "url"),
        env["BASHFLEET_SIGNING_KEY_FILE"]["value"]: ("bashfleet-signing", "key"),
    }
    examples = {doc["metadata"]["name"] for doc in _documents(K8S / "secret.example.yaml")}
    assert {name for name, _ in files.values()} <= examples


def test_flower_is_cluster_internal_with_basic_auth_from_a_secret(
    manifests: list[dict[str, Any]],
) -> None:
    service = _find(manifests, "Service", "flower")
    assert service["spec"]["type"] == "ClusterIP"
    assert "externalIPs" not in service["spec"]
    assert all("nodePort" not in port for port in service["spec"]["ports"])
    (container,) = _containers(_find(manifests, "Deployment", "flower"))
    assert container["args"][:4] == ["celery", "-A", "bashfleet.worker.fleet.app", "flower"]
    env = _env(container)
    assert _secret_ref(env["FLOWER_BASIC_AUTH"]) == ("bashfleet-flower", "basic-auth")
    # Probes use the one page that needs no credentials.
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthcheck"


def test_no_plaintext_passwords_and_every_secret_ref_exists(
    manifests: list[dict[str, Any]],
) -> None:
    examples = {
        (doc["metadata"]["name"], key): value
        for doc in _documents(K8S / "secret.example.yaml")
        for key, value in doc["stringData"].items()
    }
    assert all(PLACEHOLDER in value for value in examples.values()), "placeholders only"
    secretish = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|AUTH|KEY", re.IGNORECASE)
    checked = 0
    for doc in manifests:
        assert PLACEHOLDER not in yaml.safe_dump(doc), doc["metadata"]["name"]
        if doc["kind"] not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        for container in _containers(doc):
            defined: set[str] = set()
            for entry in container.get("env", []):
                name = entry["name"]
                if secretish.search(name) and not name.endswith("_FILE"):  # a path, not a secret
                    assert "value" not in entry, f"{name} in clear"
                    assert _secret_ref(entry) in examples, _secret_ref(entry)
                    checked += 1
                for url in re.findall(r"rediss?://\S*", entry.get("value", "")):
                    # The workers' user; its password only as $(VAR) of a variable taken
                    # from a Secret above.
                    userinfo = re.match(rf"rediss?://{acl.WORKER_USER}:\$\((\w+)\)@", url)
                    assert userinfo and userinfo[1] in defined, url
                if "valueFrom" in entry and "secretKeyRef" in entry["valueFrom"]:
                    defined.add(name)
            # No secret expanded by the kubelet into a command line.
            argv = " ".join(container.get("command", []) + container.get("args", []))
            assert not any(f"$({name})" in argv for name in defined), argv
    # Three in Redis (the ACL init's two, the probes' one), two in Flower (the worker's
    # are files).
    assert checked == 5


def test_the_secret_example_gives_workers_and_clients_their_own_users() -> None:
    secrets_ = {doc["metadata"]["name"]: doc["stringData"]
                for doc in _documents(K8S / "secret.example.yaml")}
    passwords = secrets_["bashfleet-redis"]
    assert set(passwords) == {"worker-password", "client-password"}
    assert passwords["worker-password"] != passwords["client-password"]
    assert secrets_["bashfleet-redis-url"]["url"] == (
        f"redis://{acl.WORKER_USER}:{passwords['worker-password']}@redis.bashfleet.svc:6379/0")
    assert secrets_["bashfleet-redis-client-url"]["url"] == (
        f"redis://{acl.CLIENT_USER}:{passwords['client-password']}@redis.bashfleet.svc:6379/0")


def test_one_image_for_worker_and_flower_named_by_the_kustomization(
    manifests: list[dict[str, Any]], kustomization: dict[str, Any],
) -> None:
    (override,) = kustomization["images"]
    for kind, name in (("DaemonSet", "bashfleet-worker"), ("Deployment", "flower")):
        for container in _containers(_find(manifests, kind, name)):
            assert container["image"].rsplit(":", 1)[0] == override["name"]
    init, _ = _containers(_find(manifests, "StatefulSet", "redis"))  # the ACL file's
    assert init["image"].rsplit(":", 1)[0] == override["name"]


def _kubectl_kustomize() -> str:
    done = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rendered_kinds(text: str) -> Iterator[tuple[str, str, str | None]]:
    for doc in yaml.safe_load_all(text):
        if doc:
            yield doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace")


def test_kubectl_kustomize_renders_the_manifests(manifests: list[dict[str, Any]]) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on PATH; the parsing tests above cover the manifests")
    rendered = sorted(_rendered_kinds(_kubectl_kustomize()))
    expected = sorted(
        (d["kind"], d["metadata"]["name"], None if d["kind"] == "Namespace" else "bashfleet")
        for d in manifests
    )
    assert rendered == expected


def test_every_installer_makes_the_same_run_user() -> None:
    # bootstrap.sh (as root), the image and sysusers: one unprivileged account, a group
    # of its own, no home, no login; the engine's BASHFLEET_RUN_AS default when present.
    bootstrap = re.sub(r"\\\n\s*", " ", (ROOT / "scripts" / "bootstrap.sh").read_text())
    line = re.search(r"useradd ([^|&\n]*) bashfleet-run", bootstrap)
    assert line is not None and '[ "$(id -u)" = 0 ]' in bootstrap
    for flag in ("--system", "--user-group", "--no-create-home", "--home-dir /nonexistent",
                 "--shell /usr/sbin/nologin"):
        assert flag in line[1]
    dockerfile = re.sub(r"\\\n\s*", " ", (ROOT / "deploy" / "Dockerfile").read_text())
    image = re.search(r"useradd ([^&]*) bashfleet-run", dockerfile)
    assert image is not None
    for flag in ("--system", "--user-group", "--no-create-home", "--home-dir /nonexistent",
                 "--shell /usr/sbin/nologin"):
        assert flag in image[1]
