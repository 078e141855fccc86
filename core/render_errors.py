"""The one error a render raises, and the codes that say why."""

from __future__ import annotations

from typing import Literal

RenderErrorCode = Literal[
    "missing_variable", "unsafe_template", "template_syntax", "template_error", "render_limit"
]
Part = Literal["subject", "body", "html"]


class RenderError(Exception):
    """A template could not be rendered; ``code`` says why, ``part`` says where.

    ``message`` is for people (``template variable 'order_id' is undefined``); ``str(error)``
    prefixes it with the part. ``variable`` is set when ``code == "missing_variable"``.

    ``template_error`` covers runtime faults in the template itself (``{{ 1 / 0 }}``,
    ``{{ 'a' + 1 }}``); the other codes are described in the module docstring.
    """

    def __init__(
        self, code: RenderErrorCode, message: str, *, variable: str | None = None, part: Part | None = None
    ) -> None:
        super().__init__(f"{part}: {message}" if part else message)
        self.code: RenderErrorCode = code
        self.message = message
        self.variable = variable
        self.part = part
        self.timed_out = False  # the render ran out of its CPU-time budget (not a size limit)
        self.cpu_s = 0.0  # thread CPU the render spent before it was refused

    def __repr__(self) -> str:
        return f"RenderError(code={self.code!r}, message={self.message!r}, variable={self.variable!r})"
