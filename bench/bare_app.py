"""The baseline of the fleet benchmark: a bare Celery task that runs bash.

Same broker, same JSON wire format, same at-most-once settings and threads pool as
bashfleet's workers, and nothing else: no registry, no spill files, no sanitizing.
"""

from __future__ import annotations

import os
import subprocess

from celery import Celery

app = Celery("bare", broker=os.environ.get("BARE_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    result_backend=app.conf.broker_url,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=False,
    worker_prefetch_multiplier=1,
)


def run(command: str) -> dict[str, object]:
    """Run `bash -c command` and return its status and output."""
    done = subprocess.run(["bash", "-c", command], capture_output=True, check=False)
    return {"code": done.returncode, "stdout": done.stdout.decode(errors="replace")}


# Registered without decorator syntax: celery's decorators are untyped.
app.task(name="bare.run")(run)
