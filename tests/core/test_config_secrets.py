"""A password in a judge URL is refused by the config itself, wherever the URL comes from (a file or
--set), and no message shows it: it would otherwise reach config.resolved.toml, evaluate's settings
and the trackers before the API client ever saw it."""

import pytest

from psyrl.core.config import load_config
from psyrl.core.tomlconf import ConfigError, hide_credentials

SECRET = "s3cretPW"


def test_hide_credentials_by_hand():
    assert hide_credentials("u=http://a:b@host/v1") == "u=http://***@host/v1"
    assert hide_credentials('x="https://alice@h:1/v1"') == 'x="https://***@h:1/v1"'
    assert hide_credentials('x="http://u:p@ss@h/v1"') == 'x="http://***@h/v1"'  # to the last @
    assert hide_credentials("x=http://u:p/w@h/v1") == "x=http://***@h/v1"  # a / in the password
    assert hide_credentials('x="https://h/v1?key=sk-1"') == 'x="https://h/v1?***"'  # a query
    assert hide_credentials("plain text, no URL") == "plain text, no URL"


@pytest.mark.parametrize(
    "url",
    [
        f"http://alice:{SECRET}@localhost:8000/v1",
        f"http://alice:p@{SECRET}@localhost:8000/v1",
        f"http://alice:pa/{SECRET}@localhost:8000/v1",
        f"https://api.example.com/v1?key={SECRET}",
        f"http://alice:{SECRET}@[::1",
    ],
)
def test_no_spelling_of_a_secret_in_the_judge_url_passes_or_shows(url):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f'judge.base_url="{url}"'])
    assert SECRET not in str(e.value) and "Traceback" not in str(e.value)


@pytest.mark.parametrize("key", ["base_url", "proxy"])
def test_credentials_in_a_config_file_are_refused_without_being_echoed(tmp_path, key):
    path = tmp_path / "judge.toml"
    path.write_text(f'[judge]\nmodel = "m"\n{key} = "http://alice:{SECRET}@localhost:8000/v1"\n')
    with pytest.raises(
        ConfigError, match=f"judge.toml:3: \\[judge\\] {key}: holds credentials"
    ) as e:
        load_config(path)
    assert SECRET not in str(e.value) and "alice" not in str(e.value)


@pytest.mark.parametrize("quoted", [True, False])
def test_credentials_in_a_set_override_are_refused_without_being_echoed(quoted):
    url = f"http://alice:{SECRET}@localhost:8000/v1"
    override = f'judge.base_url="{url}"' if quoted else f"judge.base_url={url}"
    with pytest.raises(ConfigError, match="holds credentials") as e:
        load_config(None, [override])
    assert SECRET not in str(e.value) and "--set judge.base_url=" in str(e.value)


def test_a_broken_override_does_not_echo_a_password():
    with pytest.raises(ConfigError, match="invalid TOML value") as e:
        load_config(None, [f'judge.base_url="http://alice:{SECRET}@host'])
    assert SECRET not in str(e.value)
