"""Images as a host holds them."""

from __future__ import annotations

from pydantic import Field

from bashfleet.worker.wire.models.base import Model


class ImageInfo(Model):
    """An image as a host holds it (pinned by digest; `bashfleet images ls`)."""

    ref: str
    """The reference it was asked by."""
    digest: str
    """Its manifest's digest (`sha256:...`): what a workspace record pins."""
    host: str = ""
    size_bytes: int = 0
    env: list[str] = Field(default_factory=list)
    """Its config's `ENV` (`NAME=value`)."""
    workdir: str = ""
    user: str = ""
    shell: str = "bash"
    """`bash` where the image has bash, else `sh`."""
    pulled_at: float = 0.0
    last_used_at: float | None = None
    refs: list[str] = Field(default_factory=list)
    """Every reference this host holds it under (canonical spelling; `build:<dir>` for
    one built from a Dockerfile)."""
