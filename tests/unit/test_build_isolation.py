"""A build's base images as read from its Dockerfile, and the policies a build takes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bashfleet.client.aio import AsyncFleet
from bashfleet.client.errors import CallRejected
from bashfleet.worker.engine.images.build_isolation import checked_policy, dockerfile_bases
from bashfleet.worker.engine.images.image_meta import ImageError
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
from bashfleet.worker.wire.network import NetworkPolicy


@pytest.mark.parametrize(("text", "bases"), [
    ("FROM debian:bookworm\nRUN true\n", ["debian:bookworm"]),
    ("from  python:3.12-slim AS build\n", ["python:3.12-slim"]),
    ("FROM scratch\nCOPY x /\n", []),
    ("FROM --platform=linux/amd64 reg:5000/a/b@sha256:" + "0" * 64 + " as x\n",
     ["reg:5000/a/b@sha256:" + "0" * 64]),
    # Stages are not images; later stages on them pull nothing new.
    ("FROM golang:1.22 AS Build\nFROM build\nCOPY --from=build /a /a\n", ["golang:1.22"]),
    ("FROM a:1\nFROM b:2\nCOPY --from=0 /x /x\nCOPY --from=c:3 /y /y\n", ["a:1", "b:2", "c:3"]),
    ("FROM a:1\nADD --chown=1 --from=d:4 /z /z\n", ["a:1", "d:4"]),
    ("FROM a:1\nFROM a:1\n", ["a:1"]),
    # Global ARGs, with their spellings; a variable without a value leaves it out.
    ("ARG TAG=3.12\nARG BASE=python\nFROM ${BASE}:${TAG}\n", ["python:3.12"]),
    ('ARG V="1.2" W=x\nFROM img:$V-$W\n', ["img:1.2-x"]),
    ("ARG V\nFROM img:${V:-9}\n", ["img:9"]),
    ("ARG V\nFROM img:${V}\n", []),
    ("FROM a:1\nARG LATE=2\nFROM b:${LATE}\n", ["a:1"]),
    # Continuations and comments; the escape directive.
    ("# syntax=docker/dockerfile:1\n# a comment\nFROM \\\n  debian:12 \\\n  AS base\n",
     ["debian:12"]),
    ("# escape=`\nFROM `\n windows:1\n", ["windows:1"]),
    ("", []),
])
def test_the_bases_of_a_dockerfile(text: str, bases: list[str]) -> None:
    assert dockerfile_bases(text) == bases


def test_a_build_takes_none_egress_or_host_where_allowed(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    assert checked_policy(NetworkPolicy(mode="none"), settings).mode == "none"
    with pytest.raises(ImageError, match="NETWORK_HOST_OK") as caught:
        checked_policy(NetworkPolicy(mode="host"), settings)
    assert caught.value.kind == "invalid"
    allowed = settings.model_copy(update={"network_host_ok": True})
    assert checked_policy(NetworkPolicy(mode="host"), allowed).mode == "host"
    with pytest.raises(ImageError) as caught:
        checked_policy(NetworkPolicy(mode="allow", allow=("pypi.org",)), settings)
    assert caught.value.kind == "invalid"


def test_a_workspace_spec_carries_its_builds_network() -> None:
    spec = WorkspaceSpec.model_validate({"build": "/ctx", "build_network": "none"})
    assert spec.build_network == NetworkPolicy(mode="none")
    assert WorkspaceSpec(build="/ctx").build_network is None  # egress, the build's default
    with pytest.raises(ValueError, match="network"):
        WorkspaceSpec.model_validate({"build": "/ctx", "build_network": "nope"})


def test_a_build_network_comes_with_a_build_only() -> None:
    fleet = AsyncFleet("redis://127.0.0.1:1/0")  # refused before anything is reached
    with pytest.raises(CallRejected, match="build_network"):
        asyncio.run(fleet.workspace(image="debian", build_network="none"))
    with pytest.raises(CallRejected, match=r"build_network: .*sideways"):
        asyncio.run(fleet.workspace(build="/nonexistent", build_network="sideways"))
