"""Rendering: substitution, escaping, strict variables, the sandbox and the render limits."""

from __future__ import annotations

import time
from typing import Any

import pytest

from core.render import RenderedContent, Renderer, RenderError


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer()


def render_body(renderer: Renderer, body: str, data: dict[str, Any] | None = None) -> str:
    return renderer.render(subject=None, body=body, html=None, data=data or {}).body


def render_error(renderer: Renderer, body: str, data: dict[str, Any] | None = None) -> RenderError:
    with pytest.raises(RenderError) as caught:
        renderer.render(subject=None, body=body, html=None, data=data or {})
    return caught.value


def test_variables_are_substituted_in_every_part(renderer: Renderer) -> None:
    content = renderer.render(
        subject="Your order {{ order_id }} has shipped",
        body="Hi {{ user.name }}, {% for item in items %}{{ item }};{% endfor %}",
        html="<p>Order <b>{{ order_id }}</b></p>",
        data={"order_id": "A-17", "user": {"name": "Ana"}, "items": ["mug", "tee"]},
    )
    assert content == RenderedContent(
        subject="Your order A-17 has shipped", body="Hi Ana, mug;tee;", html="<p>Order <b>A-17</b></p>"
    )


def test_html_is_escaped_only_in_the_html_part(renderer: Renderer) -> None:
    name = "<script>alert('x')</script> & co"
    content = renderer.render(
        subject="Hi {{ name }}", body="Hi {{ name }}", html="<p>{{ name }}</p>", data={"name": name}
    )
    assert content.subject == f"Hi {name}"
    assert content.body == f"Hi {name}"
    assert content.html == "<p>&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co</p>"
    assert type(content.html) is str  # not Markup


def test_missing_variable_names_the_variable(renderer: Renderer) -> None:
    error = render_error(renderer, "Order {{ order_id }}", {"name": "Ana"})
    assert error.code == "missing_variable"
    assert error.variable == "order_id"
    assert error.message == "template variable 'order_id' is undefined"
    assert error.part == "body"


@pytest.mark.parametrize(
    ("body", "data", "variable"),
    [
        ("{{ user.name }}", {}, "user"),
        ("{{ user.name }}", {"user": {}}, "user.name"),
        ("{{ user.name }} {{ company.name }}", {"user": {"name": "A"}, "company": {}}, "company.name"),
        ("{{ user.address.city }}", {"user": {"address": {}}}, "user.address.city"),
        ("{{ items[2] }}", {"items": [1]}, "items[2]"),
        ("{% for item in items %}{{ item.sku }}{% endfor %}", {"items": [{}]}, "item.sku"),
        ("{% if flag %}x{% endif %}", {}, "flag"),
    ],
)
def test_missing_nested_variable_names_its_path(
    renderer: Renderer, body: str, data: dict[str, Any], variable: str
) -> None:
    error = render_error(renderer, body, data)
    assert (error.code, error.variable) == ("missing_variable", variable)


def test_missing_variable_in_subject_is_reported_for_the_subject(renderer: Renderer) -> None:
    with pytest.raises(RenderError) as caught:
        renderer.render(subject="Order {{ order_id }}", body="ok", html=None, data={})
    assert (caught.value.part, caught.value.variable) == ("subject", "order_id")
    assert str(caught.value) == "subject: template variable 'order_id' is undefined"


SSTI_PAYLOADS = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.os.popen('id').read() }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ self.__dict__ }}",
    "{{ ''|attr('__class__') }}",
    "{{ data['__class__'] }}",
    "{{ data['__cla' ~ 'ss__'] }}",
    "{{ ''|attr('__cla' ~ 'ss__') }}",
    "{{ '{0.__class__}'.format(data) }}",
    "{{ items.append(1) }}",
    "{{ data.update(x=1) }}",
    "{% set x = items.pop() %}",
    "{{ user._private }}",
]


@pytest.mark.parametrize("payload", SSTI_PAYLOADS)
def test_template_injection_is_refused_without_leaking_internals(renderer: Renderer, payload: str) -> None:
    data = {"data": {"a": 1}, "items": [1, 2], "user": {"_private": "secret"}}
    error = render_error(renderer, payload, data)
    assert error.code == "unsafe_template", error
    assert "globals" not in error.message.replace("'__globals__'", "")
    assert "secret" not in error.message
    assert "<class" not in error.message


def test_literal_private_attribute_is_refused_at_syntax_check(renderer: Renderer) -> None:
    with pytest.raises(RenderError) as caught:
        renderer.check_syntax(subject=None, body="{{ ''.__class__ }}", html=None)
    assert caught.value.code == "unsafe_template"
    assert "'__class__'" in caught.value.message


def test_syntax_error_is_reported_with_part_and_line(renderer: Renderer) -> None:
    with pytest.raises(RenderError) as caught:
        renderer.check_syntax(subject="ok", body="ok", html="<p>\n{{ name </p>")
    assert caught.value.code == "template_syntax"
    assert caught.value.part == "html"
    assert caught.value.message.startswith("line 2:")


def test_include_and_import_are_refused(renderer: Renderer) -> None:
    for source in ("{% include 'secret.txt' %}", "{% extends 'base' %}", "{% import 'm' as m %}"):
        with pytest.raises(RenderError) as caught:
            renderer.check_syntax(subject=None, body=source, html=None)
        assert caught.value.code == "template_syntax"


def test_runtime_fault_in_template_is_a_template_error(renderer: Renderer) -> None:
    assert render_error(renderer, "{{ 1 / 0 }}").code == "template_error"


def test_huge_range_is_stopped(renderer: Renderer) -> None:
    error = render_error(renderer, "{% for i in range(10**9) %}x{% endfor %}")
    assert error.code == "render_limit"


def test_nested_loops_are_stopped_by_the_time_limit() -> None:
    renderer = Renderer(max_render_ms=50)
    started = time.monotonic()
    error = render_error(
        renderer, "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    assert error.code == "render_limit"
    assert "50 ms" in error.message
    assert time.monotonic() - started < 2


def test_exponential_macro_recursion_is_stopped() -> None:
    renderer = Renderer(max_render_ms=50)
    body = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}"
    started = time.monotonic()
    assert render_error(renderer, body).code == "render_limit"
    assert time.monotonic() - started < 2


def test_output_longer_than_the_limit_is_refused() -> None:
    renderer = Renderer(max_output_chars=1_000)
    assert render_body(renderer, "{{ text }}", {"text": "x" * 1_000}) == "x" * 1_000
    error = render_error(renderer, "{% for i in range(100) %}{{ text }}{% endfor %}", {"text": "0123456789x"})
    assert error.code == "render_limit"
    assert "1000 characters" in error.message


@pytest.mark.parametrize(
    "body",
    [
        "{{ 'a' * 10**9 }}",
        "{{ [1] * 10**9 }}",
        "{{ 2 ** 1000000 }}",
        "{{ 'x'|center(10**9) }}",
        "{{ 'x'.ljust(10**9) }}",
        "{{ '%0999999999d'|format(1) }}",
        "{{ '%0999999999d' % 1 }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ ([text] * 100000)|join }}",
        "{{ ''.join([text] * 100000) }}",
        "{{ text|replace('a', text) }}",
        "{{ text|wordwrap(2, wrapstring=text) }}",
        "{% set s = text %}" + "{% set s = s ~ s %}" * 40 + "{{ s|length }}",
        "{% set ns = namespace(s=text) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% set ns = namespace(s=text) %}{% for i in range(60) %}"
        "{% set ns.s %}{{ ns.s }}{{ ns.s }}{% endset %}{% endfor %}",
    ],
)
def test_memory_bombs_are_stopped_before_they_allocate(renderer: Renderer, body: str) -> None:
    started = time.monotonic()
    assert render_error(renderer, body, {"text": "a" * 1_000}).code == "render_limit"
    assert time.monotonic() - started < 1


def test_ordinary_use_of_guarded_operations_still_works(renderer: Renderer) -> None:
    body = (
        "{{ '%s-%05d'|format('A', 7) }} {{ '{:,}'.format(1234567) }} {{ ', '.join(names) }} "
        "{{ names|join('/') }} {{ users|join(', ', attribute='name') }} {{ '-' * 3 }} {{ 2 ** 10 }} "
        "{{ 'ab'|replace('a', 'x') }} {{ 'x'|center(5) }}|"
        "{% for u in users %}{{ loop.index }}/{{ loop.length }}{% else %}none{% endfor %}"
        "{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% endfor %} {{ ns.n }}"
    )
    data = {"names": ["a", "b"], "users": [{"name": "u1"}, {"name": "u2"}]}
    assert render_body(renderer, body, data) == "A-00007 1,234,567 a, b a/b u1, u2 --- 1024 xb   x  |1/22/2 3"


def test_subject_with_a_newline_is_refused(renderer: Renderer) -> None:
    for subject, data in (("Hi\n{{ name }}", {"name": "A"}), ("Hi {{ name }}", {"name": "A\r\nBcc: evil@x"})):
        with pytest.raises(RenderError) as caught:
            renderer.render(subject=subject, body="b", html=None, data=data)
        assert caught.value.code == "unsafe_template"
        assert caught.value.message == "subject must be a single line"


def test_compiled_template_is_reused_from_the_cache() -> None:
    renderer = Renderer()
    first = renderer.compile("Hi {{ name }}")
    assert renderer.compile("Hi {{ name }}") is first
    assert renderer.compile("Hi {{ name }}", html=True) is not first
    renderer.render(subject=None, body="Hi {{ name }}", html=None, data={"name": "A"})
    assert renderer.compile("Hi {{ name }}") is first


def test_content_hash_depends_on_content_recipient_and_channel(renderer: Renderer) -> None:
    content = RenderedContent(subject="S", body="B", html=None)
    digest = renderer.content_hash(content, recipient="+15550001", channel="sms")
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest == renderer.content_hash(
        RenderedContent("S", "B", None), recipient="+15550001", channel="sms"
    )
    assert digest != renderer.content_hash(content, recipient="+15550002", channel="sms")
    assert digest != renderer.content_hash(content, recipient="+15550001", channel="push")
    assert digest != renderer.content_hash(
        RenderedContent("S", "B", ""), recipient="+15550001", channel="sms"
    )


def test_a_render_slowed_once_by_something_else_is_tried_again() -> None:
    """A garbage collection or a paused machine can use up a render's CPU budget; the render is
    tried once more before the send is refused, so only a template that is slow every time fails."""
    renderer = Renderer(max_render_ms=50)
    pauses = [0.12]

    def hiccup() -> str:
        if pauses:
            end = time.thread_time() + pauses.pop()
            while time.thread_time() < end:
                pass
        return "ok"

    body = "{{ hiccup() }}{% for i in range(50) %}{{ i }}{% endfor %}"
    out = renderer.render(subject=None, body=body, html=None, data={"hiccup": hiccup})
    assert out.body.startswith("ok0123")
    assert pauses == []  # the first try did pause, and ran out of budget
