"""Templates written to exhaust a renderer: CPU, memory, recursion, output size. Every one must be
refused (``render_limit``, ``template_syntax`` or ``template_error``), quickly and in little memory.

The first ones are the issue's reproductions; the rest vary each mechanism (another operator,
filter or container) so a check that only matches the one payload does not pass."""

from __future__ import annotations

SHARED = "{% set a=[1] %}" + "{% set a=[a,a] %}" * 24  # 2**24 leaves behind 25 lists
SHARED_DICT = "{% set a={'k':1} %}" + "{% set a={'x':a,'y':a} %}" * 24
BIG = "{% set a = 2**8000 %}" + "{% set a = a*a %}" * 18

HOSTILE: dict[str, str] = {
    # numbers that grow without bound
    "power_squaring": BIG + "{{ a % 10 }}",
    "power_squaring_16": "{% set a = 2**8000 %}" + "{% set a = a*a %}" * 16 + "{{ a % 10 }}",
    "power_literal": "{{ 9**99999 }}",
    "power_of_power": "{{ 2**(2**20) }}",
    "product_of_powers": "{{ (9**9999) * (9**9999) * (9**9999) }}",
    "factorial_loop": "{% set n = namespace(v=1) %}{% for i in range(1, 100000) %}{% set n.v = n.v * i %}{% endfor %}{{ n.v }}",
    "sum_of_huge": "{{ [9**9999, 9**9999]|sum * 9**9999 }}",
    "big_times_string": "{{ 'a' * (2**40) }}",
    "addition_doubling": "{% set n = namespace(v=3**9000) %}{% for i in range(100000) %}{% set n.v = n.v + n.v %}{% endfor %}{{ n.v }}",
    # sequences concatenated in C
    "sum_lists": "{{ ([[0]*100000]*100)|sum(start=[])|length }}",
    "sum_strings_start": "{{ (['x'*90000]*100)|sum(start='') }}",
    "sum_tuples": "{{ ([(0,)*100000]*100)|sum(start=())|length }}",
    "list_times": "{{ ([0]*100000 * 1000)|length }}",
    "string_times": "{{ ('ab' * 60000)|length }}",
    "nested_list_times": "{{ [[0]*99999]*99999 }}",
    "join_big": "{{ (['x'*1000]*1000)|join(',') }}",
    "replace_blowup": "{{ ('a'*5000)|replace('a', 'b'*5000) }}",
    "center_width": "{{ 'x'|center(10**8) }}",
    "format_width": "{{ '%999999999s'|format('x') }}",
    "brace_format_width": "{{ '{:>999999999}'.format('x') }}",
    "percent_width": "{{ '%*s' % (999999999, 'x') }}",
    "indent_lines": "{{ ('a\\n' * 40000)|indent(width=1000) }}",
    "wordwrap_string": "{{ ('a ' * 40000)|wordwrap(1, wrapstring='x'*1000) }}",
    "ljust_method": "{{ 'x'.ljust(10**9) }}",
    "expandtabs_method": "{{ ('\\t'*50000).expandtabs(10000) }}",
    "concat_loop": "{% set n = namespace(s='x') %}{% for i in range(100) %}{% set n.s = n.s ~ n.s %}{% endfor %}{{ n.s|length }}",
    # shared structure whose text form is exponential
    "repr_string": SHARED + "{{ a|string|length }}",
    "repr_output": SHARED + "{{ a }}",
    "repr_tojson": SHARED + "{{ a|tojson|length }}",
    "repr_pprint": SHARED + "{{ a|pprint|length }}",
    "repr_join": SHARED + "{{ [a, a]|join(',')|length }}",
    "repr_concat": SHARED + "{{ 'x' ~ a }}",
    "repr_percent": SHARED + "{{ '%s' % (a,) }}",
    "repr_format_method": SHARED + "{{ '{}'.format(a) }}",
    "repr_dict": SHARED_DICT + "{{ a|string|length }}",
    "repr_dict_output": SHARED_DICT + "{{ a }}",
    "repr_in_loop": SHARED + "{% for x in [a] %}{{ x }}{% endfor %}",
    "repr_upper": SHARED + "{{ a|upper }}",
    # parse and compile depth
    "parens_100": "{{ " + "(" * 100 + "1" + ")" * 100 + " }}",
    "parens_1000": "{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}",
    "brackets_100": "{{ " + "[" * 100 + "1" + "]" * 100 + " }}",
    "braces_100": "{{ " + "{'a':" * 100 + "1" + "}" * 100 + " }}",
    "nested_if_100": "{% if 1 %}" * 100 + "x" + "{% endif %}" * 100,
    "nested_for_100": "{% for i in [1] %}" * 100 + "x" + "{% endfor %}" * 100,
    "nested_with_100": "{% with a = 1 %}" * 100 + "x" + "{% endwith %}" * 100,
    "nested_filter_blocks": "{% filter upper %}" * 100 + "x" + "{% endfilter %}" * 100,
    "not_chain": "{{ " + "not " * 1000 + "1 }}",
    "minus_chain": "{{ " + "-" * 1000 + "1 }}",
    "plus_chain": "{{ " + "+".join(["1"] * 3000) + " }}",
    "or_chain": "{{ " + " or ".join(["0"] * 3000) + " }}",
    "and_chain": "{{ " + " and ".join(["1"] * 3000) + " }}",
    "filter_chain": "{{ 'a'" + "|lower" * 3000 + " }}",
    "unclosed_depth": "{{ " + "(" * 5000,
    # time
    "nested_range_loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "macro_recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "recursive_loop": "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}",
    "sort_big": "{{ range(100000)|list|sort|sort|sort|sort|sort|sort|sort|sort|sort|sort|sort|sort|length }}",
    "unique_loop": "{% for i in range(100000) %}{{ range(100000)|list|unique|list|length }}{% endfor %}",
    "range_too_big": "{{ range(10**9)|list|length }}",
    # text no provider can carry
    "lone_surrogate": "Code: {{ '\\ud800' }}",
    "lone_surrogate_low": "{{ '\\udfff' ~ 'x' }}",
}
