#!/usr/bin/env python3
"""Writes tests/data/jinja/cases.jsonl: Jinja templates with a context and what Python's jinja2 renders for
them under transformers' chat template environment (trim_blocks, lstrip_blocks, loop controls, an immutable
sandbox, raise_exception, strftime_now, transformers' tojson). test_jinja compares zipage's interpreter with
each line: {"template", "context", "text"} or {"template", "context", "error"} (jinja2 failed; zipage must
fail too).

    python3 tests/chat/make_jinja_cases.py > tests/data/jinja/cases.jsonl
"""
import datetime
import json
import sys

from hf_jinja import environment

NOW = datetime.datetime(2024, 7, 26, 9, 5, 3)

CASES = [
    # whitespace: trim_blocks, lstrip_blocks, '-' and '+', comments, the trailing newline
    ('  {% if true %}\n  x\n  {% endif %}\n  y\n', {}),
    ('a  {%- if true -%}  b  {%- endif -%}  c', {}),
    ('a\n  {%+ if true %}b{% endif %}\n', {}),
    ('{# c #}\n  {#- c -#}  x {{- " y " -}} z\n\n', {}),
    ('{% raw %}{{ not parsed }}{% endraw %}', {}),
    ('x {{ 1 }}\n{{ 2 }}  \n', {}),
    ('{%- for i in range(3) %}\n  {{ i }}\n{%- endfor %}', {}),
    ('{% if a %}\r\nA\r\n{% endif %}\r\n', {'a': True}),
    # values as str() writes them
    ('{{ none }} {{ true }} {{ 1.0 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-05 }} {{ 2.5e-7 }} {{ 123456789.125 }}', {}),
    ('{{ [1, "a", none, true, 2.5, ["x"]] }} {{ {"k": "it\'s", "n": {"m": 1}} }} {{ (1,) }} {{ (1, "b") }}', {}),
    ('{{ x }}|{{ x.y is defined }}|{{ x is undefined }}', {'x': {'y': None}}),
    ('{{ "a\\nb\\t\\u00e9\\x41\\101" }}', {}),
    ("{{ 'it''s' }} {{ \"quo\" 'ted' }}", {}),
    # arithmetic and comparisons
    ('{{ 1/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2**10 }} {{ 2**-1 }} {{ 1 + 2.5 }} {{ 3 * "ab" }}', {}),
    ('{{ "a" ~ 1 ~ none ~ undefined_name }} {{ [1] + [2] }} {{ "x" + "y" }} {{ -(3) }} {{ +4 }}', {}),
    ('{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ "a" < "b" }} {{ [1, 2] < [1, 3] }} {{ "b" in "abc" }} {{ 2 not in [1] }}', {}),
    ('{{ "k" in {"k": 1} }} {{ 1 in {"k": 1} }} {{ none is none }} {{ x is none }}', {'x': 0}),
    ('{{ a or b }} {{ a and b }} {{ not a }} {{ "yes" if a else "no" }} {{ "v" if b }}|', {'a': 0, 'b': 'B'}),
    # subscripts and slices
    ('{{ s[0] }}{{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[::2] }} {{ l[1:] }} {{ l[:-1] }} {{ l[-2] }} {{ l[10] }}|', {'s': 'héllo', 'l': [1, 2, 3]}),
    ('{{ d["a"] }} {{ d.a }} {{ d.get("b", 5) }} {{ d.get("a") }} {{ d.missing }}|{{ l.0 }}', {'d': {'a': 1}, 'l': [7]}),
    ('{{ (1, 2, 3)[1:] }} {{ "abc"[5:9] }}|{{ "abc"[-9:1] }}', {}),
    # set, scopes, namespace
    ('{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}', {}),
    ('{% set ns = namespace(n=0, s="") %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}', {}),
    ('{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}', {}),
    ('{% set block %}  in {{ 1 + 1 }}  {% endset %}[{{ block }}]{% set up | upper %}abc{% endset %}{{ up }}', {}),
    ('{% if true %}{% set z = 3 %}{% endif %}{{ z }}', {}),
    # loops
    ('{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}', {'l': ['a', 'b', 'c']}),
    ('{% for x in l if x > 1 %}{{ loop.index }}:{{ x }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}', {'l': [1, 2, 3]}),
    ('{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}', {'d': {'b': 1, 'a': 2}}),
    ('{% for c in "hé" %}[{{ c }}]{% endfor %}{% for x in undefined_name %}x{% endfor %}', {}),
    ('{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}', {}),
    ('{% for i in [1, 2] %}{% for j in [3, 4] %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{% endfor %}', {}),
    ('{% for x in l %}{{ loop.cycle("odd", "even") }} {% endfor %}', {'l': [1, 2, 3]}),
    # macros
    ('{% macro m(a, b=2, c="x") %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c="y") }}{{ m(a=5) }}', {}),
    ('{% macro outer(x) %}{{ inner(x) }}!{% endmacro %}{% macro inner(x) %}<{{ x }}>{% endmacro %}{{ outer(1) }}{{ outer(2)|trim }}', {}),
    ('{% set g = 5 %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 6 %}{{ m() }}', {}),
    # filters
    ('{{ "  x  "|trim }}|{{ "xxaxx"|trim("x") }}|{{ "aBc"|upper }}{{ "aBc"|lower }}|{{ "hello world"|title }}|{{ "hELLO"|capitalize }}', {}),
    ('{{ l|length }} {{ "héllo"|length }} {{ d|length }} {{ undefined_name|length }} {{ l|count }}', {'l': [1, 2], 'd': {'a': 1}}),
    ('{{ l|join(", ") }} {{ l|first }} {{ l|last }} {{ l|list }} {{ "ab"|list }} {{ l|reverse|list }} {{ "abc"|reverse }}', {'l': [3, 1, 2]}),
    ('{{ l|sort }} {{ l|sort(reverse=true) }} {{ w|sort }} {{ w|sort(case_sensitive=true) }} {{ l|sum }} {{ l|min }} {{ l|max }}', {'l': [3, 1, 2], 'w': ['b', 'A', 'a']}),
    ('{{ d|dictsort }} {{ d|dictsort(by="value") }} {{ d|items|list }} {{ d|tojson }}', {'d': {'b': 1, 'a': 2}}),
    ('{{ x|default("d") }} {{ none|default("d") }} {{ ""|default("d", true) }} {{ 0|d("z", boolean=true) }} {{ y|default("d") }}', {'y': 'Y'}),
    ('{{ ms|map(attribute="role")|join(",") }} {{ ms|selectattr("role", "equalto", "user")|map(attribute="content")|list }} {{ ms|rejectattr("role", "eq", "user")|list|length }}', {'ms': [{'role': 'user', 'content': 'a'}, {'role': 'assistant', 'content': 'b'}]}),
    ('{{ l|select("odd")|list }} {{ l|reject("even")|list }} {{ l|map("string")|join }} {{ ["a", "b"]|map("upper")|list }} {{ l|select|list }}', {'l': [0, 1, 2, 3]}),
    ('{{ ms|selectattr("x")|list|length }} {{ ms|selectattr("y", "defined")|list }} {{ ms|map(attribute="x", default=0)|list }}', {'ms': [{'x': 1}, {'y': 2}]}),
    ('{{ l|unique|list }} {{ ["A", "a"]|unique|list }} {{ l|batch(2)|list }}', {'l': [1, 2, 1, 3]}),
    ('{{ "a-b-c"|replace("-", "+") }} {{ "aaa"|replace("a", "b", 2) }} {{ "x"|replace("", "-") }}', {}),
    ('{{ "a\\nb\\n\\nc"|indent }}|{{ "a\\nb"|indent(2, true) }}|{{ "a\\n\\nb"|indent(1, blank=true) }}', {}),
    ('{{ "42"|int }} {{ "x"|int }} {{ "x"|int(7) }} {{ 3.9|int }} {{ "2.5"|float }} {{ 2|float }} {{ -3|abs }} {{ 2.567|round(1) }} {{ 2.5|round }} {{ 2.1|round(0, "ceil") }}', {}),
    ('{{ 42|string + "!" }} {{ none|string }} {{ [1]|string }} {{ "<a>"|e }} {{ "<a>"|safe }} {{ "x"|wordcount }} {{ "%s-%d"|format("a", 3) }}', {}),
    ('{{ "x"|center(7) }}|{{ d|attr("get") is callable }}', {'d': {}}),
    ('{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ x|tojson(sort_keys=true) }}|{{ x|tojson(separators=(",", ":")) }}', {'x': {'b': [1, 2.0, None, True, 'é"\n\\'], 'a': {}, 'c': []}}),
    ('{{ "é🙂\\u2028"|tojson(ensure_ascii=true) }} {{ "é🙂"|tojson }} {{ 1.5e300|tojson }} {{ {1: "a", true: "b"}|tojson }}', {}),
    # tests
    ('{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is integer }}{{ "a" is string }}{{ [] is iterable }}{{ {} is mapping }}{{ [] is mapping }}{{ "a" is sequence }}', {}),
    ('{{ x is defined }}{{ undefined_name is defined }}{{ none is none }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 1 is lt 2 }}{{ "ab" is lower }}{{ "AB" is upper }}{{ false is false }}{{ true is true }}{{ x is sameas none }}', {'x': None}),
    ('{{ raise_exception is callable }} {{ undefined_name is iterable }} {{ none is iterable }} {{ "upper" is filter }} {{ "odd" is test }}', {}),
    # Python methods
    ('{{ " a b "|trim }} {{ " a b ".strip() }}|{{ "xax".strip("x") }}|{{ "  a".lstrip() }}|{{ "a  ".rstrip() }}|{{ "a,b,,c".split(",") }} {{ " a  b ".split() }} {{ "a b c".split(" ", 1) }} {{ "a,b,c".rsplit(",", 1) }}', {}),
    ('{{ "abc".startswith("a") }}{{ "abc".endswith(("x", "c")) }}{{ "abc".find("c") }}{{ "abc".find("z") }}{{ "aXa".count("a") }}{{ "abc".replace("b", "B") }}{{ "AbC".lower() }}{{ "AbC".upper() }}{{ "hello there".title() }}', {}),
    ('{{ "{} and {}".format(1, "b") }} {{ "{0}{1}{0}".format("a", "b") }} {{ "{x}!".format(x=2) }} {{ "{{}}".format() }} {{ ", ".join(["a", "b"]) }} {{ "a\\nb\\n".splitlines() }}', {}),
    ('{{ "12".isdigit() }}{{ "ab".isalpha() }}{{ " ".isspace() }}{{ "".isdigit() }}{{ "Ab".isupper() }}', {}),
    ('{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.items()|length }} {{ l.index(2) }} {{ l.count(1) }}', {'d': {'a': 1, 'b': 2}, 'l': [1, 2, 1]}),
    ('{{ dict(a=1, b=2) }} {{ range(2, 8, 3)|list }} {{ range(3, 0, -1)|list }} {{ namespace(a=1).a }}', {}),
    ("{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y') }}", {}),
    # markup (the safe and escape filters)
    ('{{ "<b>"|safe + "<i>" }} {{ "<i>" + "<b>"|safe }} {{ ("<b>"|safe) ~ "<i>" }} {{ "<b>"|e|e }}', {}),
    # generators (map/select/items filters): no len, not JSON, always true
    ('{{ [1]|map("string") is iterable }} {% if []|select %}true{% endif %} {{ ([]|select|list) == [] }}', {}),
    # the {% filter %} and {% generation %} blocks
    ('{% filter upper %}abc {{ "d" }}{% endfilter %}|{% filter trim|upper %}  x  {% endfilter %}', {}),
    ('{% generation %}kept{% endgeneration %}', {}),
    # errors: both must fail
    ('{{ raise_exception("no " ~ "way") }}', {}),
    ('{{ undefined_name.attr }}', {}),
    ('{{ undefined_name + 1 }}', {}),
    ('{{ undefined_name|tojson }}', {}),
    ('{{ "a" + 1 }}', {}),
    ('{{ 1 < "a" }}', {}),
    ('{{ l.append(1) }}', {'l': []}),
    ('{{ d.update({}) }}', {'d': {}}),
    ('{{ [1]|map("string")|length }}', {}),
    ('{{ [1]|map("string")|tojson }}', {}),
    ('{{ d.items()|tojson }}', {'d': {}}),
    ('{{ 1 / 0 }}', {}),
    ('{{ x|no_such_filter }}', {}),
    ('{% if false %}{{ x|no_such_filter }}{% endif %}ok', {}),
    ('{{ x is no_such_test }}', {}),
    ('{% for %}', {}),
    ('{% if true %}unclosed', {}),
    ('{{ 1 + }}', {}),
    ('{% set ns2 = 1 %}{% set ns2.a = 2 %}', {}),
    ('{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}', {}),
    ('{{ none.attr }}|{{ none.attr.deeper }}', {}),
    ('{{ "x" is divisibleby(0) }}', {}),
    ('{% call m() %}{% endcall %}', {}),
]


def main():
    env = environment(NOW)
    for template, context in CASES:
        out = {'template': template, 'context': context}
        try:
            out['text'] = env.from_string(template).render(**context)
        except Exception as e:  # noqa: BLE001 - any failure is an expected error
            out['error'] = f'{type(e).__name__}: {e}'
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + '\n')


if __name__ == '__main__':
    main()
