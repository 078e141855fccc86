"""The render box's child process (``python -m core.render_child``): renders the jobs the parent's
``core.render_box.RenderBox`` sends, one at a time, length-prefixed pickles on stdin and stdout."""

from __future__ import annotations

import os
import pickle
import resource
import sys
import time
from functools import lru_cache

from core.render_box import BOX_MEMORY_BYTES, LENGTH, Answer, Job
from core.render_errors import RenderError
from core.render_template import TemplateRenderer
from core.render_types import RequestBudget


@lru_cache(maxsize=4)
def _child_renderer(max_output_chars: int, max_render_ms: int) -> TemplateRenderer:
    return TemplateRenderer(max_output_chars=max_output_chars, max_render_ms=max_render_ms)


def render_job(job: Job) -> Answer:
    """Runs in the box: the content or the refusal's fields, and the CPU it took."""
    limits, (subject, body, html), data, budget_ms = job
    renderer = _child_renderer(*limits)
    started = time.thread_time()
    try:
        budget = RequestBudget(budget_ms) if budget_ms is not None else None
        content = renderer.render(subject=subject, body=body, html=html, data=data, budget=budget)
    except RenderError as exc:
        return None, (exc.code, exc.message, exc.variable, exc.part), time.thread_time() - started
    return content, None, time.thread_time() - started


def serve() -> None:
    """The box's loop: length-prefixed pickles in on stdin, answers out on stdout. Its address
    space is capped (``BOX_MEMORY_BYTES``): a render that would exceed it ends the box, not the
    machine. It runs at the lowest CPU priority (nice 19): the tenants it serves already spent
    their share, so their renders get what the API, the workers and PostgreSQL leave."""
    resource.setrlimit(resource.RLIMIT_AS, (BOX_MEMORY_BYTES, BOX_MEMORY_BYTES))
    os.nice(19 - os.nice(0))
    read, write = sys.stdin.buffer, sys.stdout.buffer
    while header := read.read(LENGTH.size):
        job = pickle.loads(read.read(LENGTH.unpack(header)[0]))
        answer = pickle.dumps(render_job(job))
        write.write(LENGTH.pack(len(answer)) + answer)
        write.flush()


if __name__ == "__main__":
    serve()
