"""The pure parts of images: references, platforms, manifests, configs, shells, which
images to collect, the tools' command lines and failures."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.images import image_tools as tools
from bashfleet.worker.engine.images.image_meta import (
    MAX_REF_LENGTH,
    ImageError,
    Platform,
    choose_manifest,
    digest_of,
    host_platform,
    layers_of,
    parse_config,
    parse_ref,
    resolve_within,
    shell_of,
    to_collect,
)
from bashfleet.worker.engine.images.images import context_digest
from bashfleet.worker.settings import Settings, secret_paths
from bashfleet.worker.wire.models import ImageInfo

DIGEST = "sha256:" + "a" * 64

# ---------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("ref", "canonical", "domain"),
    [
        ("debian", "docker.io/library/debian:latest", "docker.io"),
        ("debian:bookworm", "docker.io/library/debian:bookworm", "docker.io"),
        ("docker://debian:12", "docker.io/library/debian:12", "docker.io"),
        ("user/repo", "docker.io/user/repo:latest", "docker.io"),
        ("ghcr.io/org/app:v1.2", "ghcr.io/org/app:v1.2", "ghcr.io"),
        ("localhost/app", "localhost/app:latest", "localhost"),
        ("127.0.0.1:5000/bashfleet/debian:bookworm",
         "127.0.0.1:5000/bashfleet/debian:bookworm", "127.0.0.1:5000"),
        (f"127.0.0.1:5000/a/b@{DIGEST}", f"127.0.0.1:5000/a/b@{DIGEST}", "127.0.0.1:5000"),
        (f"quay.io/a/b:t@{DIGEST}", f"quay.io/a/b:t@{DIGEST}", "quay.io"),
        ("a__b/c-d.e_f:T_1.x-y", "docker.io/a__b/c-d.e_f:T_1.x-y", "docker.io"),
    ],
)
def test_references_are_read_as_the_registry_reads_them(
    ref: str, canonical: str, domain: str
) -> None:
    parsed = parse_ref(ref)
    assert (parsed.canonical, parsed.domain) == (canonical, domain)
    assert parsed.transport == f"docker://{canonical}"
    assert parse_ref(canonical) == parsed


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("", "required"),
        ("-debian", "starting with '-'"),
        ("--authfile=/etc/shadow", "starting with '-'"),
        ("debian bookworm", "whitespace"),
        ("debian\n", "whitespace"),
        ("debian\x00", "control character"),
        ("deb\u200bian", "control character"),
        ("a" * (MAX_REF_LENGTH + 1), "too long"),
        ("dir:/etc", "not an image reference"),
        ("oci-archive:/tmp/x.tar", "not an image reference"),
        ("docker-daemon:debian:latest", "not an image reference"),
        ("Debian", "not an image reference"),
        ("debian:", "not an image reference"),
        ("debian@sha256:abc", "not an image reference"),
        ("debian@md5:" + "a" * 32, "not an image reference"),
        ("a//b", "not an image reference"),
        ("debian:" + "t" * 129, "not an image reference"),
        ("user:pass@host/x", "not an image reference"),
    ],
)
def test_bad_references_are_refused_as_invalid(ref: str, why: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_ref(ref)
    assert caught.value.kind == "invalid" and why in caught.value.message


def test_a_reference_that_is_not_text_is_refused() -> None:
    with pytest.raises(ImageError):
        parse_ref(42)


@given(st.text(max_size=200))
def test_any_text_is_a_canonical_reference_or_refused_as_invalid(text: str) -> None:
    try:
        parsed = parse_ref(text)
    except ImageError as exc:
        assert exc.kind == "invalid"
        return
    # What is accepted can never reach a tool as a flag or another transport.
    assert not text.startswith("-") and not any(ch.isspace() for ch in text)
    assert parsed.transport.startswith("docker://") and "--" not in parsed.domain
    assert parse_ref(parsed.canonical) == parsed


@given(st.from_regex(r"\A[a-z0-9]{1,8}(/[a-z0-9]{1,8}){0,2}(:[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,10})?\Z"))
def test_well_formed_names_always_parse(text: str) -> None:
    parsed = parse_ref(text)
    assert parsed.canonical.endswith(text.rsplit("/", maxsplit=1)[-1]) or parsed.tag == "latest"


# ----------------------------------------------------------------------- platforms


@pytest.mark.parametrize(
    ("machine", "arch", "variant"),
    [("x86_64", "amd64", None), ("aarch64", "arm64", None), ("armv7l", "arm", "v7"),
     ("riscv64", "riscv64", None), ("mips", "mips", None)],
)
def test_host_platform(machine: str, arch: str, variant: str | None) -> None:
    assert host_platform(machine) == Platform("linux", arch, variant)


def _index(*platforms: tuple[str, str, str | None]) -> bytes:
    manifests = []
    for number, (os_name, arch, variant) in enumerate(platforms):
        platform = {"os": os_name, "architecture": arch}
        if variant:
            platform["variant"] = variant
        manifests.append({"digest": f"sha256:{str(number) * 64}", "platform": platform,
                          "mediaType": "application/vnd.oci.image.manifest.v1+json"})
    return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests}).encode()


def test_an_index_gives_this_platforms_manifest() -> None:
    raw = _index(("linux", "arm64", "v8"), ("linux", "amd64", None), ("windows", "amd64", None))
    assert choose_manifest(raw, Platform("linux", "amd64")) == ("sha256:" + "1" * 64,
                                                                digest_of(raw))
    assert choose_manifest(raw, Platform("linux", "arm64", "v8"))[0] == "sha256:" + "0" * 64


def test_an_index_without_this_platform_is_not_found() -> None:
    with pytest.raises(ImageError) as caught:
        choose_manifest(_index(("linux", "arm64", None)), Platform("linux", "amd64"))
    assert caught.value.kind == "not_found" and "linux/arm64" in caught.value.message


def test_a_plain_manifest_is_its_own_digest() -> None:
    raw = json.dumps({"schemaVersion": 2, "config": {"digest": DIGEST},
                      "layers": [{"digest": DIGEST, "size": 5}]}).encode()
    assert choose_manifest(raw, Platform("linux", "amd64")) == (digest_of(raw), None)
    assert layers_of(raw) == (DIGEST, [(DIGEST, 5)])


def test_a_manifest_that_is_not_json_is_invalid() -> None:
    with pytest.raises(ImageError, match="not JSON"):
        choose_manifest(b"<html>", Platform("linux", "amd64"))


# ------------------------------------------------------------------------- configs


def test_the_config_gives_env_workdir_and_user() -> None:
    raw = json.dumps({"architecture": "amd64", "config": {
        "Env": ["PATH=/bin", "A=b=c"], "WorkingDir": "/work", "User": "1000:1000"}}).encode()
    config = parse_config(raw)
    assert (config.env, config.workdir, config.user) == (("PATH=/bin", "A=b=c"), "/work",
                                                         "1000:1000")


@pytest.mark.parametrize("raw", [b"{}", b'{"config": null}', b'{"config": {"Env": null}}'])
def test_absent_config_fields_are_empty(raw: bytes) -> None:
    config = parse_config(raw)
    assert (config.env, config.workdir, config.user) == ((), "", "")


@pytest.mark.parametrize("raw", [b"[]", b'{"config": []}', b'{"config": {"Env": "A=b"}}',
                                 b'{"config": {"Env": [1]}}'])
def test_malformed_configs_are_invalid(raw: bytes) -> None:
    with pytest.raises(ImageError) as caught:
        parse_config(raw)
    assert caught.value.kind == "invalid"


# -------------------------------------------------------------------------- shells


def _executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/false\n")
    path.chmod(0o755)


def test_bash_through_the_images_own_merged_usr_link(tmp_path: Path) -> None:
    _executable(tmp_path / "usr" / "bin" / "bash")
    (tmp_path / "bin").symlink_to("usr/bin")
    assert shell_of(tmp_path) == "bash"


def test_an_absolute_link_is_followed_inside_the_image_not_on_the_host(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    # The host has /usr/bin/bash; the image does not.
    assert os.path.exists("/usr/bin/bash")
    (tmp_path / "bin" / "bash").symlink_to("/usr/bin/bash")
    assert shell_of(tmp_path) == "sh"
    _executable(tmp_path / "usr" / "bin" / "bash")
    assert shell_of(tmp_path) == "bash"


def test_dotdot_stops_at_the_images_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    _executable(tmp_path / "bash")  # outside the image, where ../../ would lead on the host
    (root / "bin" / "bash").symlink_to("../../../bash")
    assert resolve_within(root, "/bin/bash") is None  # root/bash: not in the image
    assert resolve_within(root, "/bin/../../..") == root
    assert shell_of(root) == "sh"


@pytest.mark.parametrize("kind", ["loop", "not_executable", "directory", "missing"])
def test_no_usable_bash_is_sh(tmp_path: Path, kind: str) -> None:
    (tmp_path / "bin").mkdir()
    bash = tmp_path / "bin" / "bash"
    if kind == "loop":
        bash.symlink_to("/bin/bash")
    elif kind == "not_executable":
        bash.write_text("x")
        bash.chmod(0o644)
    elif kind == "directory":
        bash.mkdir()
    assert shell_of(tmp_path) == "sh"


# ---------------------------------------------------------------------- collection


def _info(name: str, size: int, used: float | None, pulled: float = 0.0) -> ImageInfo:
    digest = "sha256:" + name * 64
    return ImageInfo(ref=name, digest=digest, size_bytes=size, pulled_at=pulled,
                     last_used_at=used)


def _names(chosen: list[ImageInfo]) -> list[str]:
    return [info.ref for info in chosen]


def test_collect_takes_the_old_then_the_least_recently_used_over_the_cap() -> None:
    infos = [_info("a", 10, 100.0), _info("b", 10, 900.0), _info("c", 10, 500.0),
             _info("d", 10, None, pulled=50.0)]
    now = 1000.0
    assert _names(to_collect(infos, now=now, max_age_s=1e9, max_bytes=100, in_use=())) == []
    assert _names(to_collect(infos, now=now, max_age_s=800, max_bytes=100,
                             in_use=())) == ["d", "a"]
    assert _names(to_collect(infos, now=now, max_age_s=1e9, max_bytes=15,
                             in_use=())) == ["d", "a", "c"]


def test_collect_never_takes_one_in_use_or_used_recently() -> None:
    infos = [_info("a", 10, 100.0), _info("b", 10, 990.0)]
    assert _names(to_collect(infos, now=1000.0, max_age_s=0, max_bytes=0,
                             in_use={"sha256:" + "a" * 64})) == ["b"]
    assert _names(to_collect(infos, now=1000.0, max_age_s=0, max_bytes=0, in_use=(),
                             min_age_s=60)) == ["a"]


@given(st.lists(st.tuples(st.integers(0, 1000), st.floats(0, 1000)), max_size=12,
                unique_by=lambda pair: pair[1]),
       st.integers(0, 5000), st.floats(0, 2000))
def test_collect_leaves_the_cap_met_unless_in_use_and_is_lru_ordered(
    pairs: list[tuple[int, float]], cap: int, max_age: float
) -> None:
    infos = [ImageInfo(ref=str(n), digest=f"sha256:{n:064x}", size_bytes=size, last_used_at=used)
             for n, (size, used) in enumerate(pairs)]
    busy = {info.digest for info in infos[::3]}
    chosen = to_collect(infos, now=2000.0, max_age_s=max_age, max_bytes=cap, in_use=busy)
    assert not {info.digest for info in chosen} & busy
    used = [info.last_used_at for info in chosen]
    assert used == sorted(used)  # type: ignore[type-var]
    kept = sum(info.size_bytes for info in infos) - sum(info.size_bytes for info in chosen)
    unused_kept = [info for info in infos if info not in chosen and info.digest not in busy]
    assert kept <= cap or not unused_kept


# ------------------------------------------------------------------- tool lines


def _auth(tmp_path: Path) -> Path:
    token = base64.b64encode(b"me:hunter2-secret").decode()
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"auths": {"reg.example:5000": {"auth": token}}}))
    return path


def test_registry_flags_name_the_files_and_insecure_hosts_only(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, registry_auth_file=_auth(tmp_path),
                        registry_certs_dir=tmp_path, registry_insecure=("lab:5000",))
    assert tools.registry_flags(settings, "reg.example:5000", "src-") == [
        "--src-authfile", str(tmp_path / "auth.json"), "--src-cert-dir", str(tmp_path)]
    assert tools.registry_flags(settings, "lab:5000")[-1] == "--tls-verify=false"


def test_a_missing_auth_file_is_unavailable(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, registry_auth_file=tmp_path / "nope.json")
    with pytest.raises(ImageError) as caught:
        tools.registry_flags(settings, "x")
    assert caught.value.kind == "unavailable"


def test_the_reference_reaches_skopeo_after_a_double_dash(tmp_path: Path) -> None:
    argv = tools.inspect_argv(Settings(state_dir=tmp_path), parse_ref("reg.example/a:1"))
    assert argv[-2:] == ["--", "docker://reg.example/a:1"]


def test_the_settings_hide_the_auth_file_and_the_certs_dir(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, registry_auth_file=tmp_path / "auth.json",
                        registry_certs_dir=tmp_path / "certs")
    assert set(secret_paths(settings)) == {tmp_path / "auth.json", tmp_path / "certs"}


def test_registries_conf_marks_the_insecure_hosts(tmp_path: Path) -> None:
    assert tools.registries_conf(Settings(state_dir=tmp_path)) is None
    conf = tools.registries_conf(Settings(state_dir=tmp_path, registry_insecure=("lab:5000",)))
    assert conf is not None and 'location = "lab:5000"' in conf and "insecure = true" in conf


@pytest.mark.parametrize(
    ("stderr", "kind", "said"),
    [
        ('time="x" level=fatal msg="Error parsing image name \\"docker://r/a:1\\": reading '
         'manifest 1 in r/a: manifest unknown: manifest unknown"', "not_found",
         "no such image: reading manifest 1 in r/a: manifest unknown"),
        ('level=fatal msg="reading manifest x in r/a: unauthorized: authentication required"',
         "unavailable", "refused this host's credentials"),
        ('level=fatal msg="pinging container registry r: Get \\"https://r/v2/\\": dial tcp: '
         'connect: connection refused"', "unavailable", 'Get "https://r/v2/"'),
        ("", "unavailable", "without saying why"),
        ("error: exit status 3\n\n", "unavailable", "exit status 3"),
    ],
)
def test_tool_failures_are_one_line_with_their_kind(
    stderr: str, kind: str, said: str, tmp_path: Path
) -> None:
    error = tools.failure("r/a:1", stderr, Settings(state_dir=tmp_path))
    assert error.kind == kind and said in error.message and "\n" not in error.message


@pytest.mark.parametrize(
    ("stderr", "said", "not_said"),
    [
        # skopeo run by a user that may not read the default auth file: a local file,
        # not the registry; it used to be "the registry refused this host's credentials".
        ('time="x" level=fatal msg="Error parsing image name \\"docker://r/a:1\\": '
         'open /run/containers/1000/auth.json: permission denied"',
         "may not use a file of its own", "refused"),
        ('level=fatal msg="mkdir /run/containers/1000: permission denied"',
         "not a refusal of the registry", "refused this host"),
        # A registry's refusal that also names a local denial is still the registry's.
        ('level=fatal msg="open /tmp/x: permission denied; unauthorized: authentication '
         'required"', "refused this host's credentials", "may not use"),
        # Go's quoting of a list of errors: rendered, never `\n\t` shown as written.
        ('level=fatal msg="copying: 2 errors occurred:\\n\\t* denied: requested access '
         'to the resource is denied\\n\\t* x\\n\\n"',
         "2 errors occurred: * denied: requested access", "\\n"),
    ],
)
def test_a_local_denial_is_not_the_registrys_and_escapes_are_rendered(
    stderr: str, said: str, not_said: str, tmp_path: Path
) -> None:
    error = tools.failure("r/a:1", stderr, Settings(state_dir=tmp_path))
    assert error.kind == "unavailable"
    assert said in error.message and not_said not in error.message, error.message
    assert "\n" not in error.message and "\\t" not in error.message


def test_a_tool_message_never_shows_a_credential(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, registry_auth_file=_auth(tmp_path))
    token = base64.b64encode(b"me:hunter2-secret").decode()
    error = tools.failure("x", f"msg=\"bad auth {token} or hunter2-secret\"", settings)
    assert "hunter2-secret" not in error.message and token not in error.message
    assert "***" in error.message


def test_a_long_message_is_cut(tmp_path: Path) -> None:
    error = tools.failure("x", "y" * 5000, Settings(state_dir=tmp_path))
    assert len(error.message) < tools.MAX_REASON + 20


def test_mounts_under_finds_the_deepest_first_with_escapes(tmp_path: Path) -> None:
    root = os.path.realpath(tmp_path)
    info = "\n".join([
        f"1 2 0:1 / {root}/b rw - overlay x rw",
        f"3 2 0:1 / {root}/b/c\\040d rw - overlay x rw",
        "4 2 0:1 / /elsewhere rw - ext4 x rw",
        f"5 2 0:1 / {root}bc rw - ext4 x rw",
    ])
    assert tools.mounts_under(tmp_path, info) == [f"{root}/b/c d", f"{root}/b"]


def test_a_missing_tool_names_its_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ImageError) as caught:
        tools.tool("buildah")
    assert caught.value.kind == "unavailable" and "apt-get install buildah" in caught.value.message


# ------------------------------------------------------------------ build contexts


def test_the_context_digest_follows_content_names_modes_and_links(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_text("1")
    first = context_digest(tmp_path)
    assert context_digest(tmp_path) == first
    changes: list[Callable[[], object]] = [
        lambda: (tmp_path / "sub" / "f").write_text("2"),
        lambda: (tmp_path / "sub" / "f").chmod(0o600),
        lambda: (tmp_path / "sub" / "f").rename(tmp_path / "sub" / "g"),
        lambda: (tmp_path / "link").symlink_to("sub"),
    ]
    seen = {first}
    for change in changes:
        change()
        digest = context_digest(tmp_path)
        assert digest not in seen
        seen.add(digest)


@pytest.mark.parametrize("digest", [None, "sha512:" + "a" * 128, "sha256:../../etc", 5])
def test_a_document_naming_another_digest_is_invalid(digest: object) -> None:
    manifest = json.dumps({"config": {"digest": digest}, "layers": []}).encode()
    with pytest.raises(ImageError, match="unsupported digest"):
        layers_of(manifest)
    index = json.dumps({"manifests": [{"digest": digest, "platform": {
        "os": "linux", "architecture": "amd64"}}]}).encode()
    with pytest.raises(ImageError, match="unsupported digest"):
        choose_manifest(index, Platform("linux", "amd64"))


def test_build_ids_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASHFLEET_BUILD_IDS", "[300000, 1000]")
    monkeypatch.setenv("BASHFLEET_BUILD_AS_ROOT", "true")
    settings = Settings()
    assert settings.build_ids == (300000, 1000) and settings.build_as_root


def test_build_settings_survive_the_supervisors_hand_over(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from bashfleet.worker.fleet.supervisor import settings_env  # noqa: PLC0415

    given = Settings(state_dir=tmp_path, build_ids=(7000, 10), build_as_root=True,
                     registry_insecure=("a:1", "b:2"), registry_auth_file=tmp_path / "a.json")
    for name, value in settings_env(given).items():
        monkeypatch.setenv(name, value)
    read = Settings()
    assert (read.build_ids, read.build_as_root) == ((7000, 10), True)
    assert read.registry_insecure == ("a:1", "b:2")
    assert read.registry_auth_file == tmp_path / "a.json"


@pytest.mark.parametrize("ids", [(0, 10), (5, 0), (2**32 - 10, 20)])
def test_build_ids_must_fit(ids: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="build_ids"):
        Settings(build_ids=ids)


def test_builds_run_in_a_user_namespace_unless_trusted(tmp_path: Path) -> None:
    context, iid = tmp_path / "ctx", tmp_path / "iid"
    mapped = tools.bud_args(Settings(state_dir=tmp_path, build_ids=(7000, 10)), context,
                            context / "Dockerfile", iid)
    assert mapped[mapped.index("--userns-uid-map") + 1] == "0:7000:10"
    assert mapped[mapped.index("--userns-gid-map") + 1] == "0:7000:10"
    assert mapped[-2:] == ["--", str(context)]
    trusted = Settings(state_dir=tmp_path, build_as_root=True)
    assert "--userns-uid-map" not in tools.bud_args(trusted, context, context / "D", iid)
    assert tools.build_driver(trusted) == "overlay"
