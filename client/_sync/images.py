# Generated from client/_async/images.py by scripts/unasync.py:
# edit that file and run the script.
"""The fleet's images: `Images`, the part of `Fleet` that lists, pulls and removes
the OCI images its hosts hold (a workspace's `image=` stands on one). Each host is asked
at once and answers on its control queue; a long pull is asked again every PULL_POLL_S,
so a host's control threads stay free.

Written for asyncio; `client/_sync/images.py` is generated from it by
`scripts/unasync.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from bashfleet.client._core.constants import CTL_TIMEOUT_S, PULL_POLL_S
from bashfleet.client._core.messages import control_request
from bashfleet.client._sync import records
from bashfleet.client._sync.base import FleetBase
from bashfleet.client.errors import BashfleetError, HostUnavailable, WorkerError, image_error_for
from bashfleet.worker.wire.control import (
    ControlRequest,
    ImageList,
    ImagePull,
    ImagePullRequest,
    ImageRemoved,
    ImageRemoveRequest,
    ImagesRequest,
)
from bashfleet.worker.wire.models import ImageInfo, Model

R = TypeVar("R", bound=Model)
T = TypeVar("T")


class Images(FleetBase):
    """`Fleet`'s images: `images`, `pull_image`, `remove_image`."""

    def images(self, *, host: str | None = None) -> list[ImageInfo]:
        """The images `host` holds, or every live host (`ImageInfo.host` says whose):
        pulled or built there, shared by every owner of the host, least recently used
        first on each."""
        hosts = self._image_hosts(host)
        answers = self._ask_each(dict.fromkeys(hosts, ImagesRequest()), ImageList)
        return [info for answer in _all_or_raise(answers).values() for info in answer.images]

    def pull_image(
        self, ref: str, *, host: str | None = None, refresh: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> list[ImageInfo]:
        """Pull an image onto `host`, or onto every live host, unless it is held there
        already (a pull of it under way is joined); the image as each host holds it.
        `refresh`: ask the registry where a tag points now. `progress` hears the hosts'
        progress lines (`host: line`). ImageError when a host cannot pull it (the other
        hosts' pulls go on)."""
        first = control_request(ImagePullRequest, ref=ref, refresh=refresh, wait_s=PULL_POLL_S)
        asked = dict.fromkeys(self._image_hosts(host), first)
        pulled: dict[str, ImageInfo | BashfleetError] = {}
        while asked:
            # A host holds each question at most PULL_POLL_S: the pull runs on a thread
            # of its own there, and the control consumer's threads stay free.
            answers = self._ask_each(asked, ImagePull, CTL_TIMEOUT_S + PULL_POLL_S)
            for name, state in answers.items():
                if isinstance(state, ImagePull):
                    _say(progress, name, state.lines)
                    if not state.done:
                        asked[name] = first.model_copy(
                            update={"pull_id": state.pull_id, "seen": state.seen})
                        continue
                pulled[name] = _image_of(name, state)
                del asked[name]
        return list(_all_or_raise(pulled).values())

    def remove_image(self, ref: str, *, host: str | None = None) -> list[str]:
        """Remove an image (by a reference it was pulled as, or its digest) from `host`,
        or from every live host holding it; the hosts it was removed from. An admin
        client's call (a host's images are shared by its owners); ImageError `invalid`
        where a workspace uses it."""
        request = control_request(ImageRemoveRequest, ref=ref)
        hosts = self._image_hosts(host)
        answers = _all_or_raise(self._ask_each(dict.fromkeys(hosts, request),
                                                     ImageRemoved))
        return [name for name, answer in answers.items() if answer.removed]

    def _image_hosts(self, host: str | None) -> list[str]:
        """`host`, or every live host (HostUnavailable when there is none)."""
        if host is not None:
            return [host]
        live = sorted(self._on_redis(records.live_hosts))
        if not live:
            raise HostUnavailable("no live host in the fleet")
        return live

    def _ask_each(self, questions: Mapping[str, ControlRequest], response: type[R],
                        timeout: float = CTL_TIMEOUT_S) -> dict[str, R | BashfleetError]:
        """Send each host its image request at once, then read every answer: a host's
        failure as its exception (ImageError for the image's own), the others read all
        the same."""
        sent = {name: self._send_control(name, question, timeout)
                for name, question in questions.items()}
        answers: dict[str, R | BashfleetError] = {}
        for name, each in sent.items():
            try:
                answers[name] = self._await_control(each, response, errors=image_error_for)
            except BashfleetError as exc:
                answers[name] = exc
        return answers



def _all_or_raise(answers: Mapping[str, T | BashfleetError]) -> dict[str, T]:
    """Every host's answer; the first host's failure raised when there is one."""
    for answer in answers.values():
        if isinstance(answer, BashfleetError):
            raise answer
    return {name: answer for name, answer in answers.items()
            if not isinstance(answer, BashfleetError)}


def _say(progress: Callable[[str], None] | None, host: str, lines: tuple[str, ...]) -> None:
    """A host's progress lines, to whoever listens."""
    if progress is not None:
        for line in lines:
            progress(f"{host}: {line}")


def _image_of(host: str, state: ImagePull | BashfleetError) -> ImageInfo | BashfleetError:
    """What a finished pull left on a host: its image, or why there is none."""
    if isinstance(state, BashfleetError):
        return state
    return state.image or WorkerError(f"{host} ended a pull without saying its image")
