"""CPU per render of an ordinary email template: what the API (at accept) and the worker (before
the provider call) each spend on a send's content.

    .venv/bin/python -m bench.render [--renders 20000] [--runs 7]

Renders one three-part email (subject, text body, HTML body with a loop) with
``TemplateRenderer.render``, the synchronous render both callers reach, after a warm-up that
compiles it. Prints the median and every run's CPU time per render (``time.process_time``, so
other load on the machine does not count). Nothing to compare it with: it tells whether a change
to ``core/render_template.py`` made the common case cheaper or dearer.
"""

from __future__ import annotations

import argparse
import statistics
import time

from core.render_template import TemplateRenderer

SUBJECT = "Your order {{ order_id }} has shipped"
BODY = (
    "Hi {{ name }},\n\nYour order {{ order_id }} is on its way.\n"
    "{% for item in items %}- {{ item }}\n{% endfor %}\nThanks"
)
HTML = (
    "<p>Hi {{ name }},</p><p>Your order <b>{{ order_id }}</b> is on its way.</p>"
    "<ul>{% for item in items %}<li>{{ item }}</li>{% endfor %}</ul>"
)
DATA = {"name": "Ada", "order_id": "A-1234", "items": ["book", "lamp"]}


def per_render_us(renderer: TemplateRenderer, renders: int) -> float:
    """CPU microseconds per render, over ``renders`` renders."""
    started = time.process_time()
    for _ in range(renders):
        renderer.render(subject=SUBJECT, body=BODY, html=HTML, data=DATA)
    return (time.process_time() - started) / renders * 1e6


def main(renders: int, runs: int) -> None:
    renderer = TemplateRenderer()
    per_render_us(renderer, max(1, renders // 10))  # compiles, and warms the caches
    times = [per_render_us(renderer, renders) for _ in range(runs)]
    print(f"{'CPU us per render (3 parts), median':40} {statistics.median(times):8.1f}")
    print(f"{'runs':40} {', '.join(f'{t:.1f}' for t in times)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--renders", type=int, default=20_000, help="renders per run")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    main(args.renders, args.runs)
