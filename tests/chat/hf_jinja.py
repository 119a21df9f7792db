"""Python's jinja2 set up as transformers sets it up for chat templates: trim_blocks, lstrip_blocks, the
loop-controls extension, an immutable sandbox, raise_exception, strftime_now, transformers' tojson filter and its
{% generation %} block. The reference the tests/chat/*.py harnesses compare zipage's rendering with.

    from hf_jinja import jinja2, environment   # exits 77 (skipped) when python3-jinja2 is missing
"""
import datetime
import json
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print('SKIPPED: python3 jinja2 is not installed (Debian: python3-jinja2)')
    sys.exit(77)

# strftime_now's clock in the harnesses (zipage's side reads the same fixed time).
FIXED_NOW = datetime.datetime(2024, 7, 26, 0, 0, 0)


class Generation(jinja2.ext.Extension):
    """transformers' {% generation %} marker (its AssistantTracker), rendering its body as is."""
    tags = {'generation'}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(['name:endgeneration'], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method('_render'), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment(now=FIXED_NOW):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters['tojson'] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = lambda fmt: now.strftime(fmt)
    return env
