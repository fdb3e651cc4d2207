"""``docs/options.md``, rendered from the option table (:data:`sinks.worker.options.OPTION_SPECS`).

Regenerate::

    python -c "from sinks.worker.options_doc import options_markdown as m; print(m(), end='')" \
        > docs/options.md

(a unit test fails while the page and the table differ).
"""

from __future__ import annotations

from sinks.worker.options import OPTION_SPECS

_INTRO = """\
# Options

<!-- Generated from sinks/worker/options.py (OPTION_SPECS) by sinks/worker/options_doc.py;
     do not edit by hand. Regenerate: python -c "from sinks.worker.options_doc import options_markdown as m; print(m(), end='')" > docs/options.md -->

Pass options with `.option(name, value)` on the writer. Names are matched case-insensitively
(Spark lower-cases them); errors name the spelling shown here. Any `spark.cassandra.*` name
can also be set in the Spark session conf: it is then the default, and a write's option
overrides it, as in the Spark Cassandra Connector (SCC). Unknown options are an error;
unknown `spark.cassandra.*` session conf keys are ignored, since the session conf is shared
with readers. Secret values are never shown in errors, logs or the write-ahead log.
"""


def options_markdown() -> str:
    """Render :data:`OPTION_SPECS` as the Markdown page ``docs/options.md``."""
    lines = [_INTRO.rstrip("\n")]
    sections: list[str] = []
    for spec in OPTION_SPECS:
        if spec.section not in sections:
            sections.append(spec.section)
    for section in sections:
        lines += ["", f"## {section}", "", "| Option | Default | Description |", "|---|---|---|"]
        for spec in (s for s in OPTION_SPECS if s.section == section):
            default = "required" if spec.required else ("—" if spec.default is None else f"`{spec.default}`")
            doc = spec.doc + (" Secret: never shown or recorded." if spec.secret else "")
            lines.append(f"| `{spec.name}` | {default} | {doc.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"

