"""``sdrt install``'s dry run, as a newcomer tries it: a --find-links folder that does not exist and an
--index-url with no scheme went into the printed command in silence (pip then ignores them with a warning and
says only "No matching distribution found")."""

from __future__ import annotations

import pytest

from sdrt.cli import main


@pytest.mark.parametrize(("flag", "value"), [("--find-links", "missing-wheels"), ("--index-url", "pypi.org/simple"),
                                             ("--index-url", "http:/x")])
def test_a_place_pip_would_ignore_is_refused(tmp_path, capsys, flag, value):
    assert main(["install", "--dry-run", flag, str(tmp_path / value) if flag == "--find-links" else value]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and f"Where: {flag}." in err


@pytest.mark.parametrize(("flag", "value"), [("--find-links", "DIR"), ("--find-links", "https://example.com/w/"),
                                             ("--index-url", "https://example.com/simple"), ("--index-url", "DIR")])
def test_a_url_or_a_folder_that_exists_is_taken(tmp_path, capsys, flag, value):
    value = str(tmp_path) if value == "DIR" else value
    assert main(["install", "--dry-run", flag, value]) == 0
    out = capsys.readouterr().out
    assert f"{flag} {value}" in out and "dry run: nothing was installed" in out
