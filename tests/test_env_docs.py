"""docs/configuration.md lists exactly the environment variables the settings classes read, each with its default and
its field's docstring (`python -m sessiongate.env_docs` writes the tables)."""

from __future__ import annotations

import re

from sessiongate import env_docs


def test_the_documented_variables_are_the_code_s() -> None:
    text = env_docs.DOCS_FILE.read_text()
    documented = re.findall(r"^\| `(SESSIONGATE_[A-Z0-9_]+)` \|", text, flags=re.MULTILINE)
    in_code = [name for _, settings in env_docs.SETTINGS for name in env_docs.variables(settings)]
    assert documented == in_code


def test_the_tables_are_up_to_date() -> None:
    text = env_docs.DOCS_FILE.read_text()
    assert env_docs.rewrite(text) == text, "run `python -m sessiongate.env_docs`"


def test_every_setting_is_documented() -> None:
    undocumented = [
        settings.env_variable(name)
        for _, settings in env_docs.SETTINGS
        for name, field in settings.model_fields.items()
        if not field.description
    ]
    assert undocumented == []
