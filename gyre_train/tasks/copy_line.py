"""The ``copy-line`` family: read ``input.txt`` (two words on one line) and copy the line to
``answer.txt``.

It needs a tool call and its result: the words are only in the file, so the agent must Read
it, then Write what it read. Three checks, each one test case: ``answer.txt`` holds one line of
two words, the first word is right, the second is right. Each word is one token of the Qwen
vocabulary (also after a space or a JSON quote), so a tiny model can learn to copy them.
"""

from __future__ import annotations

import json
import random

from gyre_train.tasks.suite import Demonstration, Instance, ToolCall

WORDS = [
    "apple",
    "river",
    "stone",
    "lion",
    "pear",
    "cloud",
    "tiger",
    "water",
    "music",
    "house",
    "green",
    "light",
    "paper",
    "chair",
    "table",
    "bread",
    "horse",
    "glass",
    "money",
    "plant",
    "train",
    "ocean",
    "dream",
    "field",
    "heart",
    "night",
    "phone",
    "wheel",
    "storm",
    "queen",
    "robot",
    "snake",
]
PROMPT = "Read input.txt and copy its line to answer.txt."
DEMO_WEIGHTS = {"correct": 0.4, "half": 0.2, "wrong_file": 0.2, "skip_read": 0.2}
"""The warm start's mix: a correct demonstration, only the first word copied, the right line in
the wrong file, and a line made up without reading the file."""

CHECK = '''"""Checks answer.txt against the expected line; writes a JUnit XML report to argv[1]."""
import pathlib, sys
from xml.sax.saxutils import quoteattr

EXPECTED = {expected}
answer = pathlib.Path("answer.txt")
lines = answer.read_text(errors="replace").splitlines() if answer.is_file() else []
got = lines[0].split() if lines else []
cases = [
    ("one_line_of_two_words", len(lines) == 1 and len(got) == 2),
    ("first_word", len(got) > 0 and got[0] == EXPECTED[0]),
    ("second_word", len(got) > 1 and got[1] == EXPECTED[1]),
]
failed = sum(not ok for _, ok in cases)
xml = [f'<testsuite name="copy-line" tests="{{len(cases)}}" failures="{{failed}}">']
for name, ok in cases:
    body = "" if ok else "<failure message=" + quoteattr("answer.txt: " + repr(lines[:2])) + "/>"
    xml.append(f'<testcase classname="copy-line" name="{{name}}">{{body}}</testcase>')
xml.append("</testsuite>")
pathlib.Path(sys.argv[1]).write_text("\\n".join(xml))
'''


def _read_then_write(line: str, path: str, content: str) -> Demonstration:
    return Demonstration(
        calls=(
            ToolCall("Read", {"file_path": "input.txt"}, line + "\n"),
            ToolCall("Write", {"file_path": path, "content": content}, "OK"),
        ),
        answer="Done.",
    )


def make(rng: random.Random) -> Instance:
    words = rng.sample(WORDS, 2)
    line = " ".join(words)
    guess = " ".join(random.Random(line).sample(WORDS, 2))
    demonstrations = {
        "correct": _read_then_write(line, "answer.txt", line + "\n"),
        "half": _read_then_write(line, "answer.txt", words[0] + "\n"),
        "wrong_file": _read_then_write(line, "output.txt", line + "\n"),
        "skip_read": Demonstration(
            calls=(ToolCall("Write", {"file_path": "answer.txt", "content": guess + "\n"}, "OK"),),
            answer="Done.",
        ),
    }
    return Instance(
        key=line,
        prompt=PROMPT,
        files={"input.txt": line + "\n"},
        tests={"check.py": CHECK.format(expected=json.dumps(words))},
        demonstrations=demonstrations,
    )
