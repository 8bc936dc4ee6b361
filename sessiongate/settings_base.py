"""The one settings idiom of sessiongate: `EnvSettings`, the base of `GatewaySettings` and `WorkerConfig`.

A settings class declares each setting once, as a field: its type, its default, its range as a field constraint
(`Field(ge=...)`) and its documentation as the attribute docstring below it (`use_attribute_docstrings`), from which
the documented environment variables are generated (`python -m sessiongate.env_docs`). Every way of building one (the
constructor, `from_env`, `replace`, a command line) validates the same fields the same way, and a bad value is one
error of the class's `error_type` whose message names each bad value's variable (or flag). The constructor takes only
its keywords: the environment is read by `from_env`, which the entry points call, never behind a constructor's back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = ["EnvSettings", "describe_errors"]


class EnvSettings(BaseSettings):
    """Frozen settings read from `<env_prefix><FIELD>` variables by `from_env`, validated the same way however built.

    A subclass sets `env_prefix` in its `model_config` and the `error_type` its bad values raise.
    """

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        enable_decoding=False,  # a variable's text goes to the field's validators as text (lists are comma-separated)
        validate_default=True,
        use_attribute_docstrings=True,
    )

    error_type: ClassVar[type[ValueError]] = ValueError

    def __init__(self, _labels: Mapping[str, str] | None = None, **values: Any) -> None:
        """`_labels`: what to call a field's value in an error (a command line names its flags); default, its
        environment variable."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            labels = _labels or {}
            raise self.error_type(
                describe_errors(exc, lambda name: labels.get(name, self.env_variable(name)))
            ) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # the environment only through `from_env`, never behind a constructor's back

    @classmethod
    def env_variable(cls, name: str) -> str:
        """The environment variable of field `name`."""
        return f"{cls.model_config.get('env_prefix', '')}{name.upper()}"

    @classmethod
    def env_values(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        """The fields' values in `environ` (by their variables), as text: the fields' validators convert them."""
        return _MappingEnvSource(cls, environ)()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """The prefixed variables of `environ` (default `os.environ`), then non-None `overrides`, then the
        defaults."""
        values = cls.env_values(os.environ if environ is None else environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, validated like any other settings (what `dataclasses.replace` was)."""
        return type(self)(**{**self.model_dump(), **changes})


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of `os.environ`.

    `_load_env_vars` is private to pydantic-settings: the one place sessiongate overrides it (its version is capped
    in pyproject.toml, and tests/test_fenced_internals.py fails when an upgrade removes it).
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._environ.items()}


def describe_errors(exc: ValidationError, label: Callable[[str], str]) -> str:
    """One line per bad value, each naming where it came from (`label` of its field), joined by "; "."""
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a check across fields: its message names the variables
            problems.append(message)
        elif error["type"] == "extra_forbidden":
            problems.append(f"unknown setting {error['loc'][0]!r}")
        else:
            problems.append(f"{label(str(error['loc'][0]))}={error['input']!r}: {message}")
    return "; ".join(problems)
