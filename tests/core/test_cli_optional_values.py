"""A flag whose value may be left out (``--control-pixel-perfect [on|off]``) takes the next word only when it is one of
its values: left bare before the prompt it is on, and the prompt stays the prompt (argparse's ``nargs="?"`` took the
prompt as its value: "invalid choice: 'a cat'")."""

from __future__ import annotations

import pytest

from sdrt.cli import build_parser, main


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.mark.parametrize("argv, prompt, values", [
    (["--control-image", "c.png", "--control-pixel-perfect", "a cat"], ["a cat"], ["on"]),
    (["--control-image", "c.png", "--control-pixel-perfect", "model", "a cat"], ["model", "a cat"], ["on"]),
    (["--control-pixel-perfect", "off", "a cat"], ["a cat"], ["off"]),
    (["--control-pixel-perfect", "ON", "--control-pixel-perfect", "Off", "a cat"], ["a cat"], ["on", "off"]),
    (["--control-pixel-perfect=off", "a cat"], ["a cat"], ["off"]),
    (["--control-pixel", "a cat"], ["a cat"], ["on"]),  # argparse's abbreviation
    (["a cat", "--control-pixel-perfect"], ["a cat"], ["on"]),
    (["--control-pixel-perfect", "on", "on"], ["on"], ["on"]),  # the next word on/off is its value
    (["a cat", "--", "--control-pixel-perfect"], ["a cat", "--control-pixel-perfect"], []),  # after --: a word
])
def test_a_bare_flag_leaves_the_prompt_a_prompt(parser, argv, prompt, values):
    args, extra = parser.parse_known_args(["generate", *argv])
    assert extra == []
    if prompt is not None:
        assert args.args == prompt
    assert args.control_pixel_perfect == values


def test_the_flags_help_and_bad_value_are_one_line_in_cli_words(capsys):
    with pytest.raises(SystemExit) as done:
        main(["generate", "a cat", "--control-pixel-perfect=maybe"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("error: argument --control-pixel-perfect: takes on or off (or nothing: on), got 'maybe'"), err
    assert "Where: sdrt generate." in err
    with pytest.raises(SystemExit):  # after the prompt, a word that is no value: not taken, and said why
        main(["generate", "a cat", "--control-pixel-perfect", "maybe"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: maybe (--control-pixel-perfect takes on or off" in err
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "--control-pixel-perfect [on|off]" in out


def test_no_other_flag_takes_an_optional_value(parser):
    """argparse's nargs="?" on a flag swallows the word after it, whatever it is: no flag of any command has it."""
    found = []
    for sub in parser._subparsers._group_actions[0].choices.values():
        found += [a.option_strings for a in sub._actions if a.option_strings and a.nargs == "?"]
    assert found == []


def test_an_unknown_flag_after_a_bare_one_is_said_unknown_not_a_value(capsys):
    """``--control-pixel-perfect --bogus``: --bogus is an unknown flag, not a try at the value: the line says only that
    (it said --control-pixel-perfect takes on or off and '--bogus' is neither)."""
    with pytest.raises(SystemExit):
        main(["generate", "a cat", "--control-pixel-perfect", "--bogus"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --bogus." in err and "takes on or off" not in err, err


@pytest.mark.parametrize("argv, words", [
    (["generate", "MODEL", "--steps", "2", "a cat"], ["MODEL", "a cat"]),  # the prompt after an option
    (["generate", "--steps", "2", "MODEL", "--seed", "3", "a cat"], ["MODEL", "a cat"]),
    (["generate", "a cat", "--steps", "2"], ["a cat"]),
])
def test_the_prompt_may_follow_the_options(argv, words, monkeypatch):
    """argparse reads one run of positionals: ``sdrt generate MODEL --steps 2 "a cat"`` was "unrecognized arguments:
    a cat"; the words left over join the command's [MODEL] PROMPT in order, as a shell user expects."""
    import sdrt.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "check_nonempty", lambda args: seen.setdefault("args", args.args) and None)
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    sub = parser._subparsers._group_actions[0].choices["generate"]
    monkeypatch.setattr(sub, "_defaults", {**sub._defaults, "_run": lambda args: 0})
    assert cli.main(argv) == 0
    assert seen["args"] == words


def test_a_leftover_option_word_is_still_refused(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "MODEL", "--steps", "2", "a cat", "--bogus"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: a cat --bogus." in err, err


def test_a_misspelt_flag_is_answered_with_the_flag_it_is_near(capsys):
    """``--control-net`` (as docs/toolbox.md once wrote it) was "unrecognized arguments: --control-net foo" alone."""
    with pytest.raises(SystemExit):
        main(["generate", "a cat", "--control-net", "foo", "--stepz=4"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(did you mean --controlnet, --steps?)" in err, err


@pytest.mark.parametrize("flag", ["--negative", "--negative-prompt", "-n"])
def test_the_negative_prompt_has_the_names_other_tools_give_it(parser, flag):
    """``--negative-prompt`` (stable-diffusion.cpp's, and diffusers' negative_prompt) was refused with "did you mean
    --hires-negative-prompt?", which names the second pass's prompt."""
    args, extra = parser.parse_known_args(["generate", "model", "a cat", flag, "blurry"])
    assert extra == [] and args.negative == "blurry" and args.args == ["model", "a cat"]
