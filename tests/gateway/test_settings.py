"""GatewaySettings: the same validation whichever way settings are built (constructor, environment, `replace`),
each bad value one `SettingsError` naming its `SESSIONGATE_*` variable; the constructor reads no environment."""

from __future__ import annotations

import pytest

from sessiongate.gateway.settings import GatewaySettings, SettingsError


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("port", "eighty", "SESSIONGATE_PORT='eighty': Input should be a valid integer"),
        ("log_json", "perhaps", "SESSIONGATE_LOG_JSON='perhaps': Input should be a valid boolean"),
        (
            "upstream_read_timeout_s",
            "soon",
            "SESSIONGATE_UPSTREAM_READ_TIMEOUT_S='soon': Input should be a valid number",
        ),
        ("max_body_bytes", "12", "SESSIONGATE_MAX_BODY_BYTES='12': Input should be greater than or equal to 1024"),
        ("routing_policy", "random", "SESSIONGATE_ROUTING_POLICY='random': must be one of round_robin,"),
        ("advisor_tick_s", "0", "SESSIONGATE_ADVISOR_TICK_S='0': Input should be greater than or equal to 0.005"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_variable(field: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError) as from_env:
        GatewaySettings.from_env({f"SESSIONGATE_{field.upper()}": value})
    with pytest.raises(SettingsError) as from_constructor:
        GatewaySettings(**{field: value})
    assert str(from_env.value).startswith(message)
    assert str(from_constructor.value) == str(from_env.value)
    assert from_env.value.__cause__ is None  # one error: pydantic's own is not chained under it
    with pytest.raises(SettingsError, match=message.split("=")[0]):
        GatewaySettings().replace(**{field: value})


def test_every_bad_value_is_named_in_the_one_error() -> None:
    with pytest.raises(SettingsError, match=r"SESSIONGATE_PORT=.*; SESSIONGATE_HEALTH_INTERVAL_S="):
        GatewaySettings.from_env({"SESSIONGATE_PORT": "x", "SESSIONGATE_HEALTH_INTERVAL_S": "y"})
    with pytest.raises(SettingsError, match="unknown setting 'prot'"):
        GatewaySettings(prot=1)


def test_the_constructor_takes_only_its_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SESSIONGATE_PORT", "9100")
    monkeypatch.setenv("SESSIONGATE_ADMIN_KEY", "from-the-shell")
    assert GatewaySettings().port == 8000
    assert GatewaySettings().admin_key == ""
    assert GatewaySettings.from_env().port == 9100
    assert GatewaySettings.from_env(port=9200).port == 9200


def test_settings_are_frozen_and_replace_keeps_the_rest() -> None:
    settings = GatewaySettings(workers=["http://a:1/"], port=9000)
    assert settings.workers == ("http://a:1",)
    with pytest.raises(Exception, match="frozen"):
        settings.port = 1  # type: ignore[misc]
    moved = settings.replace(port=9001)
    assert (moved.port, moved.workers, settings.port) == (9001, ("http://a:1",), 9000)
    assert GatewaySettings.from_env({"SESSIONGATE_LOG_JSON": ""}).log_json is False  # empty has meant false
