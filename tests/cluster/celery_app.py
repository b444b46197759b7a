"""The Celery application of test_celery_leader_kill.py, configured as users run Celery on
RabbitMQ quorum queues: late acks, prefetch 1, publisher confirms, the task queue declared
with `x-queue-type: quorum`, and a failover list of every node's URL.

The worker process loads it as `celery -A tests.cluster.celery_app worker`; the broker URLs
and the file the task appends to come from the environment (BROKERS_ENV, RUNS_ENV). The
test process builds its own producer app with make_app() and the same task name.
"""
from __future__ import annotations

import os
import zlib
from typing import Any

from celery import Celery
from kombu import Queue

TASK_QUEUE = "tasks"
TASK_NAME = "mirrorq.record"
BROKERS_ENV = "MIRRORQ_CELERY_BROKERS"  # 'amqp://...;amqp://...;amqp://...'
RUNS_ENV = "MIRRORQ_CELERY_RUNS"  # the file each task run appends one line to


def payload_crc(payload: str) -> int:
    return zlib.crc32(payload.encode())


def record_run(runs_path: str, task_id: str, number: int, payload_ok: bool) -> None:
    """Append `TASK_ID NUMBER ok|corrupt` to `runs_path` in one write (O_APPEND: the lines
    of concurrent runs never interleave)."""
    line = f"{task_id} {number} {'ok' if payload_ok else 'corrupt'}\n".encode()
    fd = os.open(runs_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def make_app(broker_url: str, runs_path: str) -> Any:
    """A Celery app on `broker_url` (';'-separated failover list) whose task
    TASK_NAME(number, payload, crc) records its run in `runs_path`."""
    app = Celery("mirrorq_celery_test", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"confirm_publish": True},
        task_queues=[Queue(TASK_QUEUE, queue_arguments={"x-queue-type": "quorum"})],
        task_default_queue=TASK_QUEUE,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        timezone="UTC",
    )

    @app.task(name=TASK_NAME, bind=True, shared=False)
    def record(self: Any, number: int, payload: str, crc: int) -> None:
        record_run(runs_path, str(self.request.id), number, payload_crc(payload) == crc)

    return app


# the worker's app (`celery -A tests.cluster.celery_app worker`); importing this module
# without the environment (the test process, ruff, mypy) makes an app that never connects
app = make_app(os.environ.get(BROKERS_ENV, "amqp://guest:guest@127.0.0.1:1//"),
               os.environ.get(RUNS_ENV, os.devnull))
