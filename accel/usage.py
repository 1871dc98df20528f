"""argparse's usage errors as a newcomer should read them: the optional positionals
(`[CONFIG] [KEY=VALUE]`) not listed as required, and the option or command a typo probably
meant, as a mistyped config key gets."""

from __future__ import annotations

import argparse
import difflib
import re

REQUIRED = "the following arguments are required: "
UNRECOGNIZED = "unrecognized arguments: "
CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def readable(parser: argparse.ArgumentParser, message: str) -> str:
    if message.startswith(REQUIRED):
        names = [n for n in message[len(REQUIRED):].split(", ") if not n.startswith("[")]
        return REQUIRED + ", ".join(names)
    if message.startswith(UNRECOGNIZED):
        options = sorted(o for o in parser._option_string_actions if o.startswith("--"))
        typos = [a.split("=", 1)[0] for a in message[len(UNRECOGNIZED):].split()
                 if a.startswith("--")]
        return message + _meant([m for t in typos
                                 for m in difflib.get_close_matches(t, options, n=1)])
    choice = CHOICE.search(message)
    if choice:
        choices = re.findall(r"'([^']*)'", choice.group(2))
        return message + _meant(difflib.get_close_matches(choice.group(1), choices, n=1))
    return message


def _meant(names: list[str]) -> str:
    return f"; did you mean {', '.join(names)}?" if names else ""
